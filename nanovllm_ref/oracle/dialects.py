"""Golden checkpoints in the config dialect that published checkpoints use.

transformers 5 writes RoPE settings as one ``rope_parameters`` dict (``rope_type``, ``rope_theta`` and the scaling
fields); published Llama 3.x / Qwen / Mistral checkpoints (written by transformers 4) carry ``rope_theta`` at the
top level and the scaling as ``rope_scaling`` (``null`` when there is none; older ones spell ``rope_type`` as
``type``). A loader or converter that reads one dialect only runs the other without its scaling, or with the
default base 10000, silently: the goldens must come in both.

:func:`legacy_view` writes a *view* of a checkpoint in the transformers 4 dialect: the same weights and tokenizer
(links), a ``config.json`` whose RoPE fields are rewritten and nothing else; its goldens are the checkpoint's own
(the model is the same). The suite names it ``CHECKPOINT@rope_scaling`` (``--model llama3-tiny@rope_scaling``).

References: transformers ``modeling_rope_utils.py`` (``standardize_rope_params``: v4 -> v5), Llama-3.1-8B's
config.json (``"rope_scaling": {"factor": 8.0, ..., "rope_type": "llama3"}``, ``"rope_theta": 500000.0``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from .derived import link_checkpoint

LEGACY = "rope_scaling"  # the dialect suffix: CHECKPOINT@rope_scaling
DIALECTS = ("rope_parameters", LEGACY)


def legacy_rope_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with ``rope_parameters`` turned into top-level ``rope_theta`` + ``rope_scaling`` (``None`` for the
    default type, as transformers 4 wrote it); a config already in that dialect comes back unchanged."""
    out = dict(config)
    params = out.pop("rope_parameters", None)
    if params is None:
        return out
    params = dict(params)
    if "rope_theta" not in params and "rope_theta" not in out:
        raise ValueError("config.json: rope_parameters has no rope_theta and the config none at the top level")
    out["rope_theta"] = float(params.pop("rope_theta", out.get("rope_theta")))
    out["rope_scaling"] = None if params.get("rope_type", "default") == "default" and len(params) <= 1 else params
    return out


def split_dialect(name: str) -> tuple[str, str]:
    """``"llama3-tiny@rope_scaling"`` -> ``("llama3-tiny", "rope_scaling")``; no suffix: the stored dialect."""
    base, sep, dialect = name.partition("@")
    if not sep:
        return name, DIALECTS[0]
    if dialect not in DIALECTS:
        raise ValueError(f"checkpoint {name!r}: unknown config dialect {dialect!r}; use one of {DIALECTS}")
    return base, dialect


def legacy_view(checkpoint_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """A folder holding ``checkpoint_dir`` in the ``rope_scaling`` dialect (links to its files, a rewritten
    config.json), made once per checkpoint folder and config content under ``cache_dir`` (default
    ``$NANOVLLM_REF_CACHE`` or ``~/.cache/nanovllm_ref``); returns its path. The folder's path is in the key: two
    copies of one checkpoint (two checkouts, an install and a source tree) must not share links into one of them,
    which dangle once it is gone."""
    src = Path(checkpoint_dir).resolve()
    config = json.loads((src / "config.json").read_text())
    legacy = legacy_rope_config(config)
    digest = hashlib.sha256(json.dumps([str(src), legacy], sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir or os.environ.get("NANOVLLM_REF_CACHE") or Path.home() / ".cache" / "nanovllm_ref")
    dst = root / "dialects" / f"{src.name}@{LEGACY}-{digest}"
    if (dst / "config.json").is_file():
        return str(dst)
    tmp = link_checkpoint(src, dst.with_name(dst.name + f".tmp{os.getpid()}"), replaced=("config.json",))
    (tmp / "config.json").write_text(json.dumps(legacy, indent=2, sort_keys=True) + "\n")
    try:
        tmp.rename(dst)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(dst)
