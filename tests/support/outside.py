"""A temporary folder outside the checkout, for runs that must see the suite as another project does: under nox the
temporary folder is inside the checkout (.nox/.../tmp), where pytest takes the checkout's pyproject.toml as its
rootdir and puts the checkout first on sys.path, so its packages would stand in for the installed ones."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _inside_root(path: Path) -> bool:
    return path.resolve() == ROOT or ROOT in path.resolve().parents


@contextmanager
def outside_checkout(prefix: str) -> Iterator[Path]:
    """A fresh folder under the first writable temporary location that is not inside the checkout."""
    for base in (tempfile.gettempdir(), "/tmp", "/var/tmp", str(Path.home())):
        if os.path.isdir(base) and os.access(base, os.W_OK) and not _inside_root(Path(base)):
            folder = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
            break
    else:
        raise RuntimeError(f"no writable temporary folder outside the checkout {ROOT}")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
