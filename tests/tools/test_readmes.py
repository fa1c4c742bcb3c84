"""perf/README.md and tools/README.md list every file git tracks in their folder, and name no file that is gone: the
lists are what a reader of the folder goes by. A file counts as listed when its path relative to the folder is in
backticks in the first column of a table row, or lies under a folder listed that way (`baselines/nvidia-h200/`)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tracked(folder: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line.removeprefix(f"{folder}/") for line in out.splitlines()]


def listed(readme: Path) -> set[str]:
    """The names in backticks in the first cell of each table row."""
    names = set()
    for line in readme.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def covered(path: str, names: set[str]) -> bool:
    return path in names or any(n.endswith("/") and path.startswith(n) for n in names)


@pytest.mark.parametrize("folder", ["perf", "tools"])
def test_every_tracked_file_is_in_its_readme_and_every_listed_one_exists(folder):
    files = tracked(folder)
    if not files:
        pytest.skip("not a git checkout")
    names = listed(ROOT / folder / "README.md")
    assert not [f for f in files if not covered(f, names)], "tracked but not in the README's list"
    assert not [n for n in names if not any(f == n or f.startswith(n) for f in files)], "listed but not tracked"


def test_the_check_sees_a_missing_file():
    names = {"a.py", "sub/"}
    assert covered("a.py", names) and covered("sub/x.json", names) and not covered("b.py", names)
