"""Developer and CI entry points. Every session installs the CPU build of torch first (an unpinned
`torch` would pull a multi-GB CUDA build), then the project with its test extras."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

TORCH_CPU = "torch==2.13.0"


def _install(session: nox.Session, extras: str = "test,gpu") -> None:
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
    a busy 2-core machine `-n 2` was 1.7x slower (perf/RESULTS.md). `-- -n 0` forces a serial run."""
    import os

    _install(session)
    session.run("python", "-m", "golden.verify")
    other_engine = any(a.startswith("--engine") for a in session.posargs)  # e.g. one GPU engine: no parallel copies
    workers = min(4, len(os.sched_getaffinity(0)) // 2) if hasattr(os, "sched_getaffinity") else 1
    xdist = ["-n", str(workers), "--dist", "loadgroup"] if workers >= 2 and not other_engine else []
    session.run("pytest", "conformance", "-q", *xdist, *session.posargs, env={"HYPOTHESIS_PROFILE": "ci"})


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


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def perf(session: nox.Session) -> None:
    """The perf suite (GPU numbers on a GPU machine; CPU smoke variants elsewhere)."""
    _install(session)
    session.run("pytest", "perf", *session.posargs)
