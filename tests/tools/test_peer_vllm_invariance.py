"""tools/peer_vllm.py's invariance route without vLLM: which runs it makes and how it reads their verdicts (the runs
themselves, a pytest subprocess per mode, are replaced by canned pytest summaries)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import peer_vllm
from tools.peer_common import all_passed


def test_pytest_summary_reads_the_last_counts_line() -> None:
    assert peer_vllm.pytest_summary("x\n5 passed, 14 warnings in 321.56s (0:05:21)\n") == "5 passed"
    assert peer_vllm.pytest_summary("==== 1 failed, 4 passed in 12.00s ====") == "1 failed, 4 passed"
    assert peer_vllm.pytest_summary("Traceback ... killed") == "no pytest summary"


def canned(monkeypatch, answers: dict[tuple[str, bool], str]) -> list[tuple[str, bool]]:
    calls = []

    def run(model, mode, env, log, trials, timeout_s):
        calls.append((mode, bool(env)))
        return answers[(mode, bool(env))]

    monkeypatch.setattr(peer_vllm, "invariance_run", run)
    return calls


def test_exact_pass_skips_tolerance_and_the_missing_cpu_mode_is_a_known_failure(monkeypatch,
                                                                                 tmp_path: Path) -> None:
    calls = canned(monkeypatch, {("exact", False): "5 passed", ("exact", True): "1 failed"})
    rows = peer_vllm.invariance_rows(["qwen3-gqa4"], "vLLM", tmp_path, 2, 60.0)
    assert calls == [("exact", False), ("exact", True)]
    assert rows[0]["verdict"] == "pass (5 passed)"
    assert rows[1]["verdict"].startswith("FAIL, known: vLLM's batch-invariant mode has no CPU implementation")
    assert all_passed(rows)


@pytest.mark.parametrize("tolerance", ["5 passed", "1 failed, 4 passed"])
def test_exact_failure_runs_tolerance_which_decides(monkeypatch, tmp_path: Path, tolerance: str) -> None:
    calls = canned(monkeypatch, {("exact", False): "2 failed, 3 passed", ("tolerance", False): tolerance,
                                 ("exact", True): "5 passed"})
    rows = peer_vllm.invariance_rows(["qwen3-gqa4"], "vLLM", tmp_path, 2, 60.0)
    assert calls == [("exact", False), ("tolerance", False), ("exact", True)]
    noise = tolerance == "5 passed"  # exact fails, tolerance passes: no bug, no batch-invariant mode
    exact = "FAIL, known: not bitwise batch-invariant, within tolerance (2 failed, 3 passed)" if noise else \
        "FAIL (2 failed, 3 passed)"
    assert [r["verdict"] for r in rows] == [exact, f"{'pass' if noise else 'FAIL'} ({tolerance})", "pass (5 passed)"]
    assert all_passed(rows) == noise
