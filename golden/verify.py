"""Check ``golden/`` against ``golden/manifest.json``; never regenerates anything.

    python -m golden.verify

Exits 0 when every file listed in the manifest exists with the recorded sha256 and no unlisted
file sits in the data folders (``checkpoints/``, ``outputs/``); otherwise prints each missing,
mismatched or unexpected file and exits 1. Source files (``*.py``, ``README.md``) are not hashed:
they are tracked by git.

Extension point: any folder ``golden/<name>/`` with its own ``manifest.json`` (at least
``{"files": {"<path relative to that folder>": "<sha256>", ...}}``, e.g. ``golden/sampling/``, made by its own
script) is verified the same way: each listed file must match, and every other file under that folder except
sources (``*.py``, ``*.md``), its ``manifest.json`` and ``__pycache__`` must be listed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from golden.load import GOLDEN_DIR, MANIFEST_PATH

DATA_DIRS = ("checkpoints", "outputs")
SOURCE_SUFFIXES = (".py", ".md")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_listed(root: Path, files: dict[str, str], label: str) -> list[str]:
    found = []
    for rel, expected in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            found.append(f"missing: {label}/{rel}")
        elif sha256(path) != expected:
            found.append(f"sha256 mismatch: {label}/{rel}")
    return found


def _unlisted(root: Path, paths: list[Path], files: dict[str, str], label: str) -> list[str]:
    return [f"not in manifest: {label}/{p.relative_to(root).as_posix()}" for p in sorted(paths)
            if p.is_file() and p.relative_to(root).as_posix() not in files and "__pycache__" not in p.parts]


def extra_manifests(golden_dir: Path = GOLDEN_DIR) -> list[Path]:
    """``golden/<name>/manifest.json`` of the folders that keep their own goldens (see the module docstring)."""
    return sorted(p for p in golden_dir.glob("*/manifest.json") if p.parent.name not in DATA_DIRS)


def problems(golden_dir: Path = GOLDEN_DIR, manifest_path: Path = MANIFEST_PATH) -> list[str]:
    """Human-readable problems; empty when everything matches."""
    if not manifest_path.is_file():
        return [f"missing manifest: {manifest_path}"]
    files: dict[str, str] = json.loads(manifest_path.read_text())["files"]
    found = _check_listed(golden_dir, files, "golden")
    for d in DATA_DIRS:
        found += _unlisted(golden_dir, list((golden_dir / d).rglob("*")), files, "golden")
    for extra in extra_manifests(golden_dir):
        root, label = extra.parent, f"golden/{extra.parent.name}"
        listed: dict[str, str] = json.loads(extra.read_text()).get("files", {})
        found += _check_listed(root, listed, label)
        data = [p for p in root.rglob("*") if p != extra and p.suffix not in SOURCE_SUFFIXES]
        found += _unlisted(root, data, listed, label)
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
    extra = [f"golden/{m.parent.name}/manifest.json" for m in extra_manifests()]
    print(f"golden/ OK: {n} files match manifest.json" + (f" (and {', '.join(extra)})" if extra else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
