"""What both columns of the mutation table share (tools/mutants.py on the CPU, tools/mutants_gpu.py on CUDA).

A `Mutant` is one planted bug: an exact snippet of a file and its replacement. Each column copies the tree
(`IGNORE` lists what the copy leaves out), applies one mutant, and runs pytest with `pytest_command` in the
environment of `pytest_env`; `failing_tests` reads the node ids that caught it from pytest's `-rfE` summary.
`check_snippets` refuses to start when a snippet no longer occurs exactly once, so the list cannot rot silently.
Both modules import this one and neither imports the other at module level.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", ".nox", ".venv", ".whl", "build", "dist", "*.egg-info", "__pycache__",
                                ".pytest_cache", ".hypothesis", ".benchmarks", ".ruff_cache", "examples")
# conformance options (global, from the plugin): one checkpoint in float32
OPTIONS = ("--model", "qwen3-tiny", "--dtype", "float32", "--report", os.devnull)
# the fp8 tier's kernel check: nanovllm_ref's fp8 kernels against the oracle's rule, on CUDA when there is one
FP8_KERNEL_CHECK = ("conformance/test_fp8_kv.py", "-k", "kernels")
# the conformance suite without its kernel module, the cheap-and-sharp workload first
CONFORMANCE = ("conformance/test_workload.py", "conformance/test_golden.py", "conformance/test_invariance.py",
               "conformance/test_policy.py", "conformance/test_sampling.py", "conformance/test_sampling_steps.py",
               "conformance/test_prefix_cache.py", "conformance/test_text.py", "conformance/test_self_consistency.py",
               "conformance/test_batch_invariance.py")


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    description: str
    tests: tuple[str, ...]  # targeted: test files / node ids, run in this order, stopping at the first failure
    conformance: tuple[str, ...] = CONFORMANCE  # pytest arguments of the conformance run (after OPTIONS)
    gpu: bool = False  # the site runs only on a GPU: the conformance column needs `pytest conformance -m gpu`
    gpu_args: tuple[str, ...] = ()  # extra arguments of its `--gpu` run (tools/mutants_gpu.py), e.g. engine args
    gpu_equivalent: str = ""  # non-empty: why the rewrite changes nothing on a GPU, so the GPU column leaves it out


def check_snippets(root: Path, mutants: list[Mutant]) -> None:
    """Raise ValueError unless every mutant's snippet occurs exactly once in its file under ``root``."""
    for m in mutants:
        text = (root / m.file).read_text()
        if text.count(m.old) != 1:
            raise ValueError(f"mutant {m.name!r}: the snippet {m.old!r} occurs {text.count(m.old)} times in "
                             f"{m.file} (expected exactly once): update tools/mutants.py")


def pytest_command(args: tuple[str, ...]) -> list[str]:
    """The pytest command of a run: OPTIONS (without their --model when ``args`` name one), then ``args``."""
    options = OPTIONS[2:] if "--model" in args else OPTIONS
    return [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *options, *args]


def pytest_env(root: Path, interpret: bool) -> dict[str, str]:
    """The environment of a pytest run in the tree copy `root`: Triton in the interpreter (CPU) or compiled (GPU)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", "HYPOTHESIS_PROFILE": "mutants",
           "OMP_NUM_THREADS": "1"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def failing_tests(log: str) -> list[str]:
    """The node ids pytest's -rfE summary lists as FAILED or ERROR."""
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", log, flags=re.M)
