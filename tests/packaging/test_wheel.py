"""The wheel carries everything the conformance suite opens: a wheel built from a copy of this tree is checked
against (a) the files a short real run of the suite opens (Python's audit hook on ``open``), and (b) for every
golden checkpoint and dtype, the files the loaders read (checkpoint folder, outputs, sampling goldens, manifests;
safetensors files are opened by Rust, which no audit hook sees), and every file under golden/ and conformance/
(where any data the suite reads, e.g. a chat template, must live)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IGNORE = shutil.ignore_patterns(".git", ".nox", ".venv", ".whl", "build", "dist", "*.egg-info", "__pycache__",
                                ".pytest_cache", ".hypothesis", ".benchmarks", ".ruff_cache", "results")
AUDIT = """
import atexit, json, os, sys
root, opened = os.path.realpath(sys.argv[1]), set()
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0]))
        if path.startswith(root + os.sep):
            opened.add(os.path.relpath(path, root))
sys.addaudithook(hook)
atexit.register(lambda: open(sys.argv[2], "w").write(json.dumps(sorted(opened))))
import pytest
sys.exit(pytest.main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(src)]
    if importlib.util.find_spec("setuptools") is not None:  # build offline with the installed setuptools
        cmd[4:4] = ["--no-build-isolation", "--no-index"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    wheel, = (base / "dist").glob("nanovllm_ref-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def test_what_a_run_of_the_suite_opens_is_in_the_wheel(wheel_files: set[str], tmp_path: Path) -> None:
    log = tmp_path / "opened.json"
    args = ["conformance", "-q", "-p", "no:cacheprovider", "--model", "qwen3-tiny", "--dtype", "float32",
            "--report", str(tmp_path / "report.json"), "-k", "test_golden or sampling_golden or fixed_inputs"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HYPOTHESIS_PROFILE": "ci"}
    done = subprocess.run([sys.executable, "-c", AUDIT, str(ROOT), str(log), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    opened = [p for p in json.loads(log.read_text()) if p.split(os.sep)[0] in ("golden", "conformance", "nanovllm_ref")
              and "__pycache__" not in p]
    assert any(p.startswith("golden/sampling/") for p in opened), opened  # the run did read package data
    assert any(p.startswith("golden/checkpoints/qwen3-tiny/") for p in opened), opened
    missing = sorted(p for p in opened if p.replace(os.sep, "/") not in wheel_files)
    assert not missing, f"the suite opens files the wheel lacks: {missing}"


def test_every_golden_the_loaders_read_is_in_the_wheel(wheel_files: set[str]) -> None:
    from golden.load import DTYPES, checkpoint_path, list_checkpoints, output_paths
    from golden.make_sampling import SAMPLING_DIR

    need = {"golden/manifest.json", "golden/sampling/manifest.json", "conformance/README.md"}
    for name in list_checkpoints():
        folder = Path(checkpoint_path(name))
        need |= {f"golden/checkpoints/{name}/{f.name}" for f in folder.iterdir() if f.is_file()}
        for dtype in DTYPES:
            need |= {f"golden/outputs/{p.name}" for p in output_paths(name, dtype)}
            need.add(f"golden/sampling/{(Path(SAMPLING_DIR) / f'{name}.{dtype}.json').name}")
    # and whatever else lives beside them (a chat template or data file a test opens belongs under these folders)
    need |= {p.relative_to(ROOT).as_posix() for folder in ("golden", "conformance") for p in (ROOT / folder).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert not sorted(need - wheel_files), sorted(need - wheel_files)
    assert not any(p.startswith("tests/") for p in wheel_files)
