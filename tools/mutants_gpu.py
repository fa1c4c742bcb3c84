"""The GPU column of tools/mutants.py: every Triton-kernel mutant against ``pytest conformance -m gpu`` on CUDA.

Chosen: each mutant whose snippet lies inside a ``@triton.jit`` function (found with ``ast``, so a new kernel
mutant is picked up without a flag; the pure-torch references next to the kernels are the CPU column's), plus
those marked ``gpu=True`` (sites only a GPU runs, e.g. the flash-attn backend). Each runs, in its own copy of
the tree, the GPU conformance tests that reach its site: ``conformance/test_kernels.py -k <kernel> -m gpu``
(the kernel at full shapes, bf16 / fp16 / fp32, against its torch reference) when its CPU conformance run names
the kernel module, else ``conformance/test_golden.py -m gpu`` on one checkpoint (the engine on CUDA against the
bf16 goldens), plus the mutant's ``gpu_args``. ``--jobs`` runs go at once (a thread each, a pytest process
each, the Triton cache shared); every pytest has a timeout and the whole run a budget, so a hang is reported,
not lost. The baseline (each distinct command on an unmutated copy) is queued first and runs alongside the
mutants (one device call cannot afford a serial baseline); a mutant counts only when its command passed the
baseline. A failure that is the machine's (CUDA out of memory) is reported as such, never as caught.

    python3 -m tools.mutants --gpu --jobs 8 --budget 480 --out DIR   # table + one log per run under DIR
    python3 -m tools.mutants --gpu --list                            # the chosen mutants and their commands
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .mutation import (
    FP8_KERNEL_CHECK,
    IGNORE,
    OPTIONS,
    Mutant,
    check_snippets,
    failing_tests,
    pytest_command,
    pytest_env,
)

KERNEL_MODULE = "conformance/test_kernels.py"
INVARIANCE_MODULE = "conformance/test_batch_invariance.py"
# a fixed KV cache: sized from free memory (90% of the GPU by default), two engines started at once would
# each count the other's cache against their own budget, and the kernel tests next to them would run out
GOLDEN_GPU = ("conformance/test_golden.py", "-m", "gpu", "--engine-arg", "num_kvcache_blocks=1024")
MACHINE_FAILURES = ("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory")


def triton_kernel_lines(source: str) -> list[tuple[int, int]]:
    """(first, last) line of every function decorated with ``triton.jit`` (or another ``triton.*`` decorator)."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any(
                "triton." in ast.unparse(d) or ast.unparse(d) in ("jit", "jit()") for d in node.decorator_list):
            spans.append((node.lineno, node.end_lineno or node.lineno))
    return spans


def in_triton_kernel(root: Path, m: Mutant) -> bool:
    """Whether the mutant's snippet starts inside a Triton kernel of its file."""
    if not m.file.endswith(".py"):
        return False
    source = (root / m.file).read_text()
    line = source[: source.index(m.old)].count("\n") + 1
    return any(first <= line <= last for first, last in triton_kernel_lines(source))


def gpu_mutants(root: Path, mutants: list[Mutant] | tuple[Mutant, ...]) -> list[Mutant]:
    check_snippets(root, list(mutants))
    return [m for m in mutants if (m.gpu or in_triton_kernel(root, m)) and not m.gpu_equivalent]


def gpu_args(m: Mutant) -> tuple[str, ...]:
    """The pytest arguments (after OPTIONS) of the mutant's GPU conformance run."""
    if KERNEL_MODULE in m.conformance:
        return (*m.conformance, "-m", "gpu", *m.gpu_args)
    if INVARIANCE_MODULE in m.conformance:  # its CPU run, moved to CUDA by the gpu_args (device, dtype)
        return (*m.conformance, *m.gpu_args)
    if FP8_KERNEL_CHECK[0] in m.conformance:  # the fp8 kernels' check, which runs them on CUDA (Gluon's at 128)
        return (*FP8_KERNEL_CHECK, *m.gpu_args)
    return (*GOLDEN_GPU, *m.gpu_args)


@dataclass
class Run:
    """One pytest run: a mutant (None: the baseline of ``args``) on its own copy of the tree."""
    name: str
    mutant: Mutant | None
    args: tuple[str, ...]
    status: str = "not run (budget)"  # caught | survived | timeout | machine failure | no tests | error ...
    by: str = ""
    seconds: float = 0.0


def classify(code: int, log: str) -> tuple[str, str]:
    """(status, first failing test or reason) of a finished pytest."""
    failed = failing_tests(log)
    if code == 124:
        return "timeout", ""
    if code in (1, 2) and any(s in log for s in MACHINE_FAILURES):
        return "machine failure", "CUDA out of memory"
    if code in (1, 2):
        return "caught", failed[0] if failed else f"pytest exit {code}"
    if code == 0:
        return "survived", ""
    if code == 5:
        return "no tests", "no test collected"
    return "error", f"pytest exit {code}"


def execute(run: Run, source: Path, deadline: float, timeout: float, logs: Path | None,
            env_extra: dict[str, str] | None = None) -> Run:
    """Copy the tree, plant the mutant, run its pytest until the timeout or the deadline, classify, clean up."""
    left = min(timeout, deadline - time.monotonic())
    if left < 10 or STOP.is_set():
        return run
    with tempfile.TemporaryDirectory(prefix=f"gpu-mutant-{run.name}-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(source, root, ignore=IGNORE)
        if run.mutant is not None:
            path = root / run.mutant.file
            path.write_text(path.read_text().replace(run.mutant.old, run.mutant.new))
        t0 = time.monotonic()
        env = {**pytest_env(root, interpret=False), **(env_extra or {})}  # compiled kernels on the GPU
        proc = subprocess.Popen(pytest_command(run.args), cwd=root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        LIVE.add(proc)
        try:
            log, _ = proc.communicate(timeout=left)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # pytest and anything it started (engine workers)
            log, code = proc.communicate()[0] + "\n(timeout)", 124
        finally:
            LIVE.discard(proc)
        run.seconds = time.monotonic() - t0
    run.status, run.by = classify(code, log)
    if logs is not None:
        (logs / f"{run.name}.log").write_text(" ".join(pytest_command(run.args)[1:]) + "\n\n" + log)
    return run


LIVE: set[subprocess.Popen] = set()  # running pytests: each in its own session, so killed one by one on SIGTERM
STOP = threading.Event()  # set on SIGTERM: no further run starts


def _kill_live(signum: int, frame) -> None:
    STOP.set()
    for proc in list(LIVE):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    raise SystemExit(f"killed by signal {signum}: {len(LIVE)} pytest runs stopped")


def plan(mutants: list[Mutant]) -> list[Run]:
    """The baselines (one per distinct command), then the mutants."""
    commands = list(dict.fromkeys(gpu_args(m) for m in mutants))
    runs = [Run(f"baseline-{i}", None, args) for i, args in enumerate(commands)]
    return runs + [Run(m.name, m, gpu_args(m)) for m in mutants]


def run_all(source: Path, runs: list[Run], jobs: int, timeout: float, budget: float, logs: Path | None = None,
            env_extra: dict[str, str] | None = None, progress=print) -> list[Run]:
    """Run ``runs`` ``jobs`` at a time in their list order (baselines first); then a mutant whose command failed
    its baseline is marked so."""
    deadline = time.monotonic() + budget
    lock = threading.Lock()

    def one(run: Run) -> Run:
        execute(run, source, deadline, timeout, logs, env_extra)
        with lock:
            progress(f"{run.name}: {run.status} {run.by} ({run.seconds:.0f} s)".replace("  ", " "), flush=True)
        return run

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return mark_baseline_failures(list(pool.map(one, runs)))


def mark_baseline_failures(runs: list[Run]) -> list[Run]:
    """A mutant's result means something only when its command passed ("survived") on the unmutated tree."""
    baseline = {r.args: r for r in runs if r.mutant is None}
    for r in runs:
        base = baseline.get(r.args)
        if r.mutant is not None and (base is None or base.status != "survived"):
            failed = {"caught": "failed"}.get(base.status, base.status) if base else "missing"
            r.status, r.by = f"baseline {failed}", base.name if base else ""
    return runs


def command_text(args: tuple[str, ...]) -> str:
    return "pytest " + " ".join(pytest_command(args)[3:])


def table(runs: list[Run]) -> str:
    lines = ["| run | command | result | seconds |", "| --- | --- | --- | --- |"]
    for r in runs:
        if r.mutant is None:  # a baseline "survives" when it passes, is "caught" when it fails
            result = {"survived": "passed", "caught": "**FAILED**"}.get(r.status, f"**{r.status}**")
        else:
            result = {"caught": "caught", "survived": "**SURVIVED**"}.get(r.status, f"**{r.status}**")
        lines.append(f"| {r.name} | `{command_text(r.args)}` | {result}{f' (`{r.by}`)' if r.by else ''} "
                     f"| {r.seconds:.0f} |")
    mutants = [r for r in runs if r.mutant is not None]
    caught = sum(r.status == "caught" for r in mutants)
    lines.append(f"\n`pytest conformance -m gpu` caught {caught}/{len(mutants)} GPU mutants; not caught: "
                 f"{[f'{r.name} ({r.status})' for r in mutants if r.status != 'caught'] or 'none'}")
    return "\n".join(lines)


def main(source: Path, mutants: list[Mutant], jobs: int, timeout: float, budget: float, out: str | None,
         listing: bool) -> int:
    chosen = gpu_mutants(source, mutants)
    if listing:
        for m in chosen:
            print(f"{m.name:30} {m.file:45} {command_text(gpu_args(m))}")
        return 0
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--gpu runs `pytest conformance -m gpu`: it needs a CUDA GPU (torch.cuda.is_available() "
                         "is False); the CPU column is `python -m tools.mutants --conformance-only`")
    signal.signal(signal.SIGTERM, _kill_live)  # `timeout` around the whole run must not leave pytests behind
    logs = Path(out) if out else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    print(f"{len(chosen)} GPU mutants, {jobs} at a time, {timeout:.0f} s per run, {budget:.0f} s in all; "
          f"options {' '.join(OPTIONS)}", flush=True)
    runs = run_all(source, plan(chosen), jobs, timeout, budget, logs)
    text = table(runs)
    print(text)
    if logs is not None:
        (logs / "table.md").write_text(text + "\n")
    return 0 if all(r.status == "caught" for r in runs if r.mutant is not None) else 1
