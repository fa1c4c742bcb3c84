"""Check ``golden/`` against ``golden/manifest.json``; never regenerates anything.

    python -m golden.verify

Exits 0 when every file listed in the manifest exists with the recorded sha256 and no unlisted
file sits in the data folders (``checkpoints/``, ``outputs/``); otherwise prints each missing,
mismatched or unexpected file and exits 1. Source files (``*.py``, ``README.md``) are not hashed:
they are tracked by git.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from golden.load import GOLDEN_DIR, MANIFEST_PATH

DATA_DIRS = ("checkpoints", "outputs")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def problems(golden_dir: Path = GOLDEN_DIR, manifest_path: Path = MANIFEST_PATH) -> list[str]:
    """Human-readable problems; empty when everything matches."""
    if not manifest_path.is_file():
        return [f"missing manifest: {manifest_path}"]
    files: dict[str, str] = json.loads(manifest_path.read_text())["files"]
    found = []
    for rel, expected in sorted(files.items()):
        path = golden_dir / rel
        if not path.is_file():
            found.append(f"missing: golden/{rel}")
        elif sha256(path) != expected:
            found.append(f"sha256 mismatch: golden/{rel}")
    for d in DATA_DIRS:
        for path in sorted((golden_dir / d).rglob("*")):
            rel = path.relative_to(golden_dir).as_posix()
            if path.is_file() and rel not in files and "__pycache__" not in rel:
                found.append(f"not in manifest: golden/{rel}")
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print(
            f"golden/ verification FAILED ({len(found)} problem(s)); regenerate explicitly with "
            "`nox -s golden` only if the change is intended",
            file=sys.stderr,
        )
        return 1
    n = len(json.loads(MANIFEST_PATH.read_text())["files"])
    print(f"golden/ OK: {n} files match manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
