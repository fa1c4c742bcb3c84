"""nox installs the CPU build of torch on any machine: where pip's default torch is PyPI's CUDA build (it requires
nvidia-* wheels), from PyTorch's CPU index; where pip's default is already a CPU build (a local wheel, macOS), as pip
finds it, without reaching another index; NANOVLLM_REF_TORCH_INDEX overrides both (noxfile.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_LINE = 'nvidia-cublas-cu12==12.8.4.1; extra != "none"'  # as PyPI's Linux wheel lists it (marker simplified)


@pytest.fixture(scope="module")
def noxfile():
    pytest.importorskip("nox")
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report(version: str, requires: list[str]) -> dict:
    return {"install": [{"metadata": {"name": "torch", "version": version, "requires_dist": requires}}]}


PYPI_LINUX = report("2.13.0", ["filelock", CUDA_LINE])
LOCAL_CPU = report("2.13.0+cpu", ["filelock", "sympy>=1.13.3"])
ELSEWHERE = report("2.13.0", ['nvidia-cudnn-cu12==9.10; platform_system == "NoSuchSystem"'])


class FakeSession:
    """What nox's session receives: pip's dry run (answered with ``answer``) and the install's arguments."""

    def __init__(self, tmp: Path, answer: dict | None) -> None:
        self.tmp, self.answer, self.installs = tmp, answer, []

    def create_tmp(self) -> str:
        return str(self.tmp)

    def run(self, *args: str, **kwargs: object) -> None:
        assert args[:4] == ("python", "-m", "pip", "install") and "--dry-run" in args
        if self.answer is None:
            raise RuntimeError("pip could not resolve torch")
        Path(args[args.index("--report") + 1]).write_text(json.dumps(self.answer))

    def install(self, *args: str) -> None:
        self.installs.append(list(args))


def test_a_cuda_default_is_replaced_by_the_cpu_index(noxfile, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(noxfile.TORCH_INDEX_ENV, raising=False)
    session = FakeSession(tmp_path, PYPI_LINUX)
    noxfile.install_torch(session)
    assert session.installs == [[noxfile.TORCH_CPU, "--index-url", "https://download.pytorch.org/whl/cpu"]]


@pytest.mark.parametrize("answer", [LOCAL_CPU, ELSEWHERE, None], ids=["local-cpu-wheel", "no-cuda-here", "no-answer"])
def test_a_cpu_default_is_installed_as_pip_finds_it(noxfile, tmp_path, monkeypatch, answer) -> None:
    monkeypatch.delenv(noxfile.TORCH_INDEX_ENV, raising=False)
    session = FakeSession(tmp_path, answer)
    noxfile.install_torch(session)
    assert session.installs == [[noxfile.TORCH_CPU]]


@pytest.mark.parametrize("value, args", [("", []), ("https://mirror/whl/cpu", ["--index-url", "https://mirror/whl/cpu"])])
def test_the_environment_variable_names_the_index(noxfile, tmp_path, monkeypatch, value, args) -> None:
    monkeypatch.setenv(noxfile.TORCH_INDEX_ENV, value)
    session = FakeSession(tmp_path, PYPI_LINUX)
    noxfile.install_torch(session)
    assert session.installs == [[noxfile.TORCH_CPU, *args]]


def test_every_session_installs_torch_through_the_check() -> None:
    text = (ROOT / "noxfile.py").read_text()
    assert "session.install(TORCH_CPU" not in text and text.count("install_torch(session)") >= 5
