"""What the suite runs is the installed suite, against a server that is there: `nanovllm-ref conformance` in a folder
with its own `conformance/` (and `golden/`) package still runs the installed suite, `pytest --pyargs conformance`
there refuses the shadow loudly, and an `--engine openai:URL` that nothing listens on stops the run in one line
within seconds (nanovllm_ref/oracle/suite_options.py, nanovllm_ref/serve/cli.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.outside import outside_checkout

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
SUITE = ["--model", "qwen3-tiny", "--dtype", "float32", "-p", "no:cacheprovider"]


@pytest.fixture
def shadowing_folder() -> Iterator[Path]:
    """A folder (outside the checkout, as another project's) with a `conformance/` package of one passing test and a
    `golden/` package that breaks on import."""
    with outside_checkout("shadow") as folder:
        yield _shadowing(folder)


def _shadowing(tmp_path: Path) -> Path:
    (tmp_path / "conformance").mkdir()
    (tmp_path / "conformance" / "__init__.py").write_text("")
    (tmp_path / "conformance" / "test_shadow.py").write_text("def test_shadow():\n    assert True\n")
    (tmp_path / "golden").mkdir()
    (tmp_path / "golden" / "__init__.py").write_text("raise RuntimeError('the shadow golden package was imported')\n")
    return tmp_path


def run(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_the_cli_runs_the_installed_suite_whatever_the_folder_holds(shadowing_folder: Path) -> None:
    out = run(["-m", "nanovllm_ref.serve.cli", "conformance", *SUITE, "--collect-only", "-q"], shadowing_folder)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "test_shadow" not in out.stdout and "shadow golden" not in out.stdout + out.stderr
    assert "test_golden.py::test_golden[qwen3-tiny-float32]" in out.stdout, out.stdout[-3000:]
    said = [line for line in out.stderr.splitlines() if "is not the installed suite's" in line]
    assert len(said) == 2 and all("it is ignored; running" in line for line in said), out.stderr[-2000:]


def test_pytest_pyargs_refuses_a_shadowing_package(shadowing_folder: Path) -> None:
    out = run(["-m", "pytest", "--pyargs", "conformance", *SUITE, "-q"], shadowing_folder)
    assert out.returncode == 4, out.stdout[-3000:] + out.stderr[-3000:]  # pytest's usage error
    assert "1 passed" not in out.stdout and "test_shadow" not in out.stdout
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and f"{shadowing_folder / 'conformance'} shadows the installed suite" in err[0], err


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_is_one_line_within_seconds(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    start = time.monotonic()
    out = run(["-m", "nanovllm_ref.serve.cli", "conformance", "--engine", f"openai:{url}", *SUITE, "-q"], tmp_path)
    elapsed = time.monotonic() - start
    assert out.returncode == 2 and elapsed < 30, (elapsed, out.stdout[-2000:])  # a CLI mistake's status
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert len(lines) == 1 and f"no server answers at {url}" in lines[0], lines[:20]


def test_a_float32_run_runs_no_bfloat16_case() -> None:
    """The engine cases that run in bfloat16 whatever --dtype says (TP in bfloat16) skip under
    --dtype float32, saying why (kernel checks cover their own dtypes: --dtype is the model's)."""
    out = run(["-m", "pytest", "conformance", *SUITE, "-q", "-rs", "-k", "(bfloat16 or gpu) and not kernels"], ROOT)
    assert out.returncode == 0 and "passed" not in out.stdout.strip().splitlines()[-1], out.stdout[-3000:]
    assert "--dtype float32: this case runs in bfloat16" in out.stdout, out.stdout[-3000:]


def test_an_engine_that_cannot_start_is_one_traceback_then_one_line_per_test(tmp_path: Path) -> None:
    (tmp_path / "broken_engine.py").write_text(
        "def make_engine(model_path, dtype, **kwargs):\n    raise RuntimeError('the engine does not start')\n")
    env = {**ENV, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    args = ["-m", "pytest", "conformance", *SUITE, "--engine", "broken_engine:make_engine", "-q",
            "-k", "test_golden or test_text or test_self_consistency"]
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout[-3000:]
    assert out.stdout.count("raise RuntimeError('the engine does not start')") == 1, out.stdout[-5000:]
    again = out.stdout.count("the engine could not be built (its first test shows why): RuntimeError: the engine")
    assert again >= 2, out.stdout[-5000:]
