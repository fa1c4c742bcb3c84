"""golden.verify: the main manifest and the per-folder manifests of the extension point (golden/<name>/)."""

from __future__ import annotations

import json
from pathlib import Path

from golden.verify import problems, sha256


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "checkpoints" / "m").mkdir(parents=True)
    (tmp_path / "outputs").mkdir()
    (tmp_path / "checkpoints" / "m" / "config.json").write_text("{}")
    manifest = tmp_path / "manifest.json"
    config = "checkpoints/m/config.json"
    manifest.write_text(json.dumps({"files": {config: sha256(tmp_path / config)}}))
    sub = tmp_path / "sampling"
    sub.mkdir()
    (sub / "make.py").write_text("# a source, not hashed")
    (sub / "README.md").write_text("sources are tracked by git")
    (sub / "cases.json").write_text('{"seed": 0}')
    (sub / "manifest.json").write_text(json.dumps({"files": {"cases.json": sha256(sub / "cases.json")}}))
    return tmp_path, manifest


def test_clean_tree_with_an_extra_manifest_passes(tmp_path: Path) -> None:
    root, manifest = _tree(tmp_path)
    assert problems(root, manifest) == []


def test_extra_manifest_catches_a_changed_a_missing_and_an_unlisted_file(tmp_path: Path) -> None:
    root, manifest = _tree(tmp_path)
    (root / "sampling" / "cases.json").write_text('{"seed": 1}')
    (root / "sampling" / "new.safetensors").write_bytes(b"x")
    assert problems(root, manifest) == ["sha256 mismatch: golden/sampling/cases.json",
                                        "not in manifest: golden/sampling/new.safetensors"]
    (root / "sampling" / "cases.json").unlink()
    assert "missing: golden/sampling/cases.json" in problems(root, manifest)


def test_main_manifest_catches_an_unlisted_output(tmp_path: Path) -> None:
    root, manifest = _tree(tmp_path)
    (root / "outputs" / "x.json").write_text("{}")
    assert problems(root, manifest) == ["not in manifest: golden/outputs/x.json"]
