"""The oracle as another project uses it: nanovllm_ref and examples/external_engine pip-installed (non-editable)
into a temporary target, then `pytest --pyargs conformance --engine toy_engine.adapter:make_engine ...` from a
directory outside the repository. Checks the pytest11 entry point, the packaged golden data, a passing engine,
and a broken one failing with the prompt and position named."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.outside import outside_checkout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "external_engine"
IGNORE = shutil.ignore_patterns(".git", ".nox", ".venv", ".whl", "build", "dist", "*.egg-info", "__pycache__",
                                ".pytest_cache", ".hypothesis", ".benchmarks", ".ruff_cache", "results")


def _pip_install(src: Path, target: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), "-q", str(src)]
    if importlib.util.find_spec("setuptools") is not None:  # build offline with the installed setuptools
        cmd[4:4] = ["--no-build-isolation", "--no-index"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def site() -> Iterator[Path]:
    """A target folder holding non-editable installs of nanovllm_ref (from a copy of this tree) and toy_engine."""
    with outside_checkout("external") as base:
        yield _install_site(base)


@pytest.fixture
def elsewhere() -> Iterator[Path]:
    """The working folder of a run: outside the checkout, as another project's."""
    with outside_checkout("run") as folder:
        yield folder


def _install_site(base: Path) -> Path:
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    target = base / "site"
    _pip_install(src, target)
    _pip_install(src / "examples" / "external_engine", target)
    assert (target / "golden" / "checkpoints" / "qwen3-tiny" / "model.safetensors").is_file()
    assert (target / "golden" / "outputs" / "qwen3-tiny.float32.safetensors").is_file()
    assert not (target / "tests").exists() and (target / "toy_engine" / "adapter.py").is_file()
    return target


def _pytest(args: list[str], cwd: Path, site: Path, **env: str) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update(PYTHONPATH=str(site), **env)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def _conformance(site: Path, cwd: Path, **env: str) -> tuple[int, str]:
    return _pytest(["--pyargs", "conformance", "-q", "--engine", "toy_engine.adapter:make_engine", "--model",
                    "qwen3-tiny", "--dtype", "float32", "--report", str(cwd / "report.json"),
                    "-k", "test_golden and not gpu"], cwd, site, **env)


def test_toy_engine_passes_from_outside_the_repo(site: Path, elsewhere: Path) -> None:
    code, log = _conformance(site, elsewhere)
    assert code == 0, log[-3000:]
    assert "1 passed" in log and "toy_engine" in log, log[-3000:]
    assert '"engine": "toy_engine.adapter:make_engine"' in (elsewhere / "report.json").read_text()


def test_broken_toy_engine_fails_naming_prompt_and_position(site: Path, elsewhere: Path) -> None:
    from golden.load import load_golden

    request, step = 3, 5
    code, log = _conformance(site, elsewhere, TOY_ENGINE_BUG=f"argmin@{request}:{step}")
    assert code == 1, log[-3000:]
    name = load_golden("qwen3-tiny", "float32").prompt_names[request]
    assert f"[{name}] FAIL: gen step {step}: tokens differ" in log, log[-3000:]
    assert "1 prompts and 0 whole sets FAILED" in log, log[-3000:]


def test_installed_plugin_is_not_registered_twice_inside_the_repo(site: Path) -> None:
    """Entry point (the installed dist-info) and the root conftest both offer the plugin: one registration."""
    code, log = _pytest(["conformance", "--co", "-q", "--model", "qwen3-tiny", "--dtype", "float32"], ROOT, site)
    assert code == 0, log[-3000:]
    assert "tests collected" in log, log[-3000:]
