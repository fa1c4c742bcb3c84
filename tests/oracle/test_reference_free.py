"""The reference-free conformance modules (batch invariance, self-consistency) run as a user runs them: a nested
pytest session on the suite. Exact batch invariance is sharp enough to fail the default CPU engine (its GEMMs
reduce in an order that depends on the batch's row count); ``--reference none`` runs no transformers reference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_suite(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--model", "qwen3-tiny",
                           "--dtype", "float32", "--report", os.devnull, *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_exact_invariance_fails_the_default_engine_and_names_the_batch() -> None:
    proc = run_suite("conformance/test_batch_invariance.py", "-k", "greedy and no-prefix", "--invariance", "exact",
                     "--invariance-trials", "1")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "batch-invariance exact: greedy, trial 0: batch of" in proc.stdout and "> tol 0" in proc.stdout


def test_tolerance_invariance_and_self_consistency_pass_without_a_reference() -> None:
    proc = run_suite("conformance/test_batch_invariance.py", "conformance/test_self_consistency.py",
                     "conformance/test_golden.py", "--reference", "none", "--invariance-trials", "1", "-rs")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "--reference none: this module compares with a reference" in proc.stdout
    # 2 greedy + 2 chunk budgets x 2 (with and without the cached prefix) + 1 seeded invariance cases and the
    # self-consistency check ran;
    assert "8 passed, 2 skipped" in proc.stdout  # test_golden and test_golden_gpu skipped, proc.stdout[-3000:]
