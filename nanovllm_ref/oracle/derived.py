"""Derived checkpoints: a folder whose files link to a checkpoint's, with a few of them written anew.

Several checks serve an engine a variant of a golden checkpoint (config.json in another RoPE dialect,
dialects.py; more EOS ids, conformance/test_eos.py and test_workload.py; FP8 KV scales, fp8_kv.py; router gate
weights rescaled, moe_router.py). Each links every file it does not rewrite, so the variant costs the few files
that differ, and writes those itself. Links point at the resolved source files, so a view made of a view still
reaches the real weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def link_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, replaced: Iterable[str] = ()) -> Path:
    """Make ``dst`` (and its parents) and link into it every entry of checkpoint folder ``src`` but those named in
    ``replaced`` (the caller writes them) and those ``dst`` holds already; returns ``dst``."""
    out, skip = Path(dst), set(replaced)
    out.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.name not in skip and not os.path.lexists(out / f.name):
            os.symlink(f.resolve(), out / f.name)
    return out
