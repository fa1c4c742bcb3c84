"""Derived checkpoints: a folder whose files link to a checkpoint's, with a few of them written anew.

Several checks serve an engine a variant of a golden checkpoint (config.json in another RoPE dialect,
dialects.py; more EOS ids, conformance/test_eos.py and test_workload.py; FP8 KV scales, fp8_kv.py; router gate
weights rescaled, moe_router.py; the first layers alone, a layer-skip draft for speculative decoding,
spec_decode.py). Each links every file it does not rewrite, so the variant costs the few files
that differ, and writes those itself. Links point at the resolved source files, so a view made of a view still
reaches the real weights.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
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


LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # HF decoder layers: model.layers.N.* (Llama, Qwen, Mistral)


def first_layers_checkpoint(src: str | os.PathLike, num_layers: int, cache_dir: str | os.PathLike | None = None) -> str:
    """``src`` cut to its first ``num_layers`` decoder layers (embeddings, final norm and head kept): a
    layer-skip draft that shares the target's tokenizer and agrees with it often but not always. Made once per
    source folder and depth under ``cache_dir`` (default ``$NANOVLLM_REF_CACHE`` or ``~/.cache/nanovllm_ref``);
    returns its path. ValueError when ``num_layers`` is not below the source's depth or its weights are not in
    safetensors files."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = Path(src).resolve()
    config = json.loads((src / "config.json").read_text())
    depth = int(config.get("num_hidden_layers", 0))
    if not 1 <= num_layers < depth:
        raise ValueError(f"{src}: num_layers={num_layers} must be in [1, {depth}) (its num_hidden_layers)")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{src}: no safetensors files")
    digest = hashlib.sha256(f"{src}:{num_layers}".encode()).hexdigest()[:12]
    root = Path(cache_dir or os.environ.get("NANOVLLM_REF_CACHE") or Path.home() / ".cache" / "nanovllm_ref")
    dst = root / "derived" / f"{src.name}@layers{num_layers}-{digest}"
    if (dst / "config.json").is_file():
        return str(dst)
    index = [f.name for f in src.glob("*.safetensors.index.json")]
    tmp = link_checkpoint(src, dst.with_name(dst.name + f".tmp{os.getpid()}"),
                          replaced=["config.json", *index, *(f.name for f in files)])
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            kept = {k: st.get_tensor(k) for k in st.keys()
                    if (m := LAYER_KEY.search(k)) is None or int(m.group(1)) < num_layers}
        save_file(kept, str(tmp / f.name), metadata={"format": "pt"})
    for name in index:  # the weight map without the dropped layers
        table = json.loads((src / name).read_text())
        table["weight_map"] = {k: v for k, v in table["weight_map"].items()
                               if (m := LAYER_KEY.search(k)) is None or int(m.group(1)) < num_layers}
        (tmp / name).write_text(json.dumps(table, indent=2) + "\n")
    config["num_hidden_layers"] = num_layers
    if isinstance(config.get("layer_types"), list):  # one entry per layer
        config["layer_types"] = config["layer_types"][:num_layers]
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    try:
        tmp.rename(dst)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return str(dst)
