"""`nanovllm-ref bench` from an install: the package alone (no perf/, no checkout) runs it, draws a progress bar,
and writes its result into the user cache folder, never into the tree it runs from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding only the nanovllm_ref package, as site-packages would after `pip install`."""
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(ROOT / "nanovllm_ref", site / "nanovllm_ref", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _bench(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(cwd / "cache"), "OMP_NUM_THREADS": "1"}
    env.pop("NANOVLLM_REF_BENCH_DIR", None)
    return subprocess.run([sys.executable, "-m", "nanovllm_ref.serve.cli", "bench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_bench_help_works_outside_a_checkout(installed: Path, tmp_path: Path) -> None:
    done = _bench(installed, tmp_path, "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: nanovllm-ref bench" in done.stdout and "--out" in done.stdout


def test_bench_runs_from_the_package_and_saves_to_the_user_cache(installed: Path, tmp_path: Path) -> None:
    done = _bench(installed, tmp_path, "--arch", "tiny", "--workload", "smoke", "--device", "cpu", "--no-ceilings",
                  "--max-model-len", "256")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bench: 100%" in done.stderr and "4/4" in done.stderr  # the stage bar reached its end
    saved = list((tmp_path / "cache" / "nanovllm_ref" / "bench").glob("*_engine_tiny_smoke_tp1.json"))
    assert len(saved) == 1 and f"saved {saved[0]}" in done.stdout
    assert json.loads(saved[0].read_text())["throughput"]["output_tokens"] == 68  # workloads.smoke()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing written where it ran
    assert not (installed / "perf").exists()


def test_bench_out_folder_is_where_the_user_says(installed: Path, tmp_path: Path) -> None:
    out = tmp_path / "mine"
    done = _bench(installed, tmp_path, "--arch", "tiny", "--workload", "smoke", "--device", "cpu", "--no-ceilings",
                  "--max-model-len", "256", "--out", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(out.glob("*.json"))) == 1 and not (tmp_path / "cache").exists()
    assert "stage/s" not in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--workload", "nope"], "argument --workload: invalid choice: 'nope'"),
    (["--model", "/no/such/folder"], "--model '/no/such/folder' is not a folder with a config.json"),
    (["--tp", "0"], "--tp must be >= 1, got 0"),
    (["--penalized-fraction", "1.5"], "--penalized-fraction must be in [0, 1], got 1.5"),
])
def test_bench_mistakes_are_one_line_and_exit_2(capsys, args: list[str], message: str) -> None:
    from nanovllm_ref.testing.bench.cli import main

    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().splitlines()[-1].startswith(f"nanovllm-ref bench: error: {message}")
    assert "Traceback" not in err
