"""The README's "Structured outputs" example runs from any folder and prints what its comment says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xgrammar")

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Structured outputs\n"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.splitlines()[-2:]
    promised = re.search(r"# (.*)", snippet).group(1)
    assert first == promised and re.fullmatch("[a-z]{2,8} [0-9]{2}", second), out.stdout
