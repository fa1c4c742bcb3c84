"""A gate that compares nothing must not pass: `--benchmark-compare` needs a saved run of this machine.

pytest-benchmark, asked to compare with no saved run, warns once and runs the whole suite with nothing to
compare (exit 0); `--benchmark-compare-fail` without a baseline fails only after the suite has run. Here
`pytest_configure` (perf/conftest.py, before pytest-benchmark loads its storage) looks for the run it would
pick, with pytest-benchmark's own storage query: the newest `NNNN_*.json` of this OS / Python in the storage
folder (`perf/baselines/<gpu-slug>/` unless `--benchmark-storage` says otherwise), or the one `--benchmark-compare
=NUM` names. None found: a one-line usage error (exit 4) naming the folder and how to record a run, before any
benchmark is collected.
"""

from __future__ import annotations

from typing import Any

import pytest

RECORD = "pytest perf --benchmark-autosave"


def missing_baseline(compare: Any, compare_fail: Any, storage: str, machine: str) -> str | None:
    """Why the comparison cannot run (one line), or None when it can (or when no comparison is asked for)."""
    if not compare and not compare_fail:
        return None
    if not compare:
        return ("--benchmark-compare-fail judges against a saved run: add --benchmark-compare (and record a "
                f"run first with `{RECORD}` if there is none)")
    if not storage.startswith("file://"):
        return None  # another storage backend: pytest-benchmark's own checks apply
    from pytest_benchmark.storage.file import FileStorage
    from pytest_benchmark.utils import get_machine_id

    folder = storage.removeprefix("file://")
    pattern = "[0-9][0-9][0-9][0-9]_" if compare is True else str(compare)
    if FileStorage(folder, logger=None, default_machine_id=get_machine_id()).query(pattern):
        return None
    which = "" if compare is True else f" matching {compare!r}"
    return (f"no saved benchmark run{which} for {machine} ({get_machine_id()}) in {folder}: nothing to compare "
            f"with; record one on this machine with `{RECORD}`, then rerun with --benchmark-compare")


def require_baseline(config: pytest.Config, machine: str) -> None:
    """pytest_configure: a usage error, before collection, when a comparison is asked for and there is no run."""
    option = config.option
    if not hasattr(option, "benchmark_compare"):  # pytest-benchmark not installed: its options do not exist
        return
    why = missing_baseline(option.benchmark_compare, option.benchmark_compare_fail, option.benchmark_storage,
                           machine)
    if why:
        raise pytest.UsageError(why)
