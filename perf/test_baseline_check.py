"""The perf gate refuses to compare with nothing: no saved run means a one-line usage error before the suite runs.

The subprocess cases run `pytest perf` itself (the suite is collected only if the check lets it through), each
in seconds; the unit cases cover the check's answers with and without a saved run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from perf import PERF_DIR
from perf.baseline_check import missing_baseline

ROOT = os.path.dirname(PERF_DIR)


def _run_perf(*args: str) -> tuple[int, str, float]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "perf", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - t0


@pytest.mark.parametrize("gate", [(), ("--benchmark-compare-fail=median:10%",), ("--event-compare-fail=10",)])
def test_compare_without_a_saved_run_stops_before_the_suite(tmp_path, gate: tuple[str, ...]) -> None:
    code, out, seconds = _run_perf("--benchmark-compare", f"--benchmark-storage=file://{tmp_path}", *gate)
    errors = [line for line in out.splitlines() if line.startswith("ERROR:")]
    assert code == pytest.ExitCode.USAGE_ERROR, out[-2000:]
    assert len(errors) == 1 and "no saved benchmark run" in errors[0] and str(tmp_path) in errors[0], out[-2000:]
    assert "pytest perf --benchmark-autosave" in errors[0]
    assert " passed" not in out and "collected" not in out  # nothing ran: the check precedes collection
    assert seconds < 120, f"the check took {seconds:.0f} s"


def test_compare_fail_without_compare_is_refused(tmp_path) -> None:
    code, out, _ = _run_perf("--benchmark-compare-fail=median:10%", f"--benchmark-storage=file://{tmp_path}")
    assert code == pytest.ExitCode.USAGE_ERROR, out[-2000:]
    assert "add --benchmark-compare" in out and " passed" not in out


def _save_run(folder, name: str) -> None:
    from pytest_benchmark.utils import get_machine_id

    path = folder / get_machine_id() / name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"benchmarks": [], "machine_info": {}, "commit_info": {}}))


def test_a_saved_run_of_this_machine_lets_the_comparison_run(tmp_path) -> None:
    storage = f"file://{tmp_path}"
    assert missing_baseline(None, None, storage, "cpu") is None  # no comparison asked for: nothing to check
    assert "no saved benchmark run for cpu" in missing_baseline(True, None, storage, "cpu")
    _save_run(tmp_path, "0003_abc_20261201_000000.json")
    assert missing_baseline(True, [object()], storage, "cpu") is None
    assert missing_baseline("0003", None, storage, "cpu") is None
    assert "matching '0004'" in missing_baseline("0004", None, storage, "cpu")
    assert missing_baseline(True, None, "elasticsearch+https://host/index", "cpu") is None
