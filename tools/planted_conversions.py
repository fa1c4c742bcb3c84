"""Conversion bugs planted in a copy of a golden checkpoint, to show that a quantization tier still catches what a
broken converter produces (tolerances.QUANT_TIERS): the engine converts and runs the planted copy, which is compared
with the *original* checkpoint's float32 goldens under the tier, and must fail.

- ``drop_bias``: every bias tensor zeroed (a converter that drops ``attention_bias`` / ``o_proj.bias``, as vLLM's
  Qwen3 did), on a checkpoint with biases;
- ``rope_theta``: ``rope_theta`` 10000 in config.json, both dialects (a converter that falls back to the default);
- ``untied``: ``tie_word_embeddings`` false and a freshly initialised ``lm_head.weight`` (normal, std 0.02, what
  transformers gives a missing weight), on a tied checkpoint (a converter that does not tie the output layer).

    python -m tools.planted_conversions drop_bias qwen3-bias-hd32 OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def _copy(src: Path, dst: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return json.loads((dst / "config.json").read_text()), load_file(str(dst / WEIGHTS))


def _save(dst: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / WEIGHTS), metadata={"format": "pt"})


def drop_bias(src: Path, dst: Path) -> None:
    config, tensors = _copy(src, dst)
    biases = [k for k in tensors if k.endswith(".bias")]
    if not biases:
        raise ValueError(f"{src.name} has no bias to drop")
    for k in biases:
        tensors[k] = torch.zeros_like(tensors[k])
    _save(dst, config, tensors)


def rope_theta(src: Path, dst: Path, theta: float = 10000.0) -> None:
    config, tensors = _copy(src, dst)
    if config.get("rope_theta") == theta:
        raise ValueError(f"{src.name} already has rope_theta {theta:g}")
    config["rope_theta"] = theta
    if isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"]["rope_theta"] = theta
    _save(dst, config, tensors)


def untied(src: Path, dst: Path) -> None:
    config, tensors = _copy(src, dst)
    if not config.get("tie_word_embeddings"):
        raise ValueError(f"{src.name} has untied embeddings already")
    embed = tensors["model.embed_tokens.weight"]
    config["tie_word_embeddings"] = False
    tensors["lm_head.weight"] = torch.randn(embed.shape, generator=torch.Generator().manual_seed(0)) * 0.02
    _save(dst, config, tensors)


PLANTED: dict[str, Callable[[Path, Path], None]] = {"drop_bias": drop_bias, "rope_theta": rope_theta,
                                                    "untied": untied}
# the golden checkpoint each is planted in (every engine of tools/peer_local.py runs these architectures)
PLANTED_IN = {"drop_bias": "qwen3-bias-hd32", "rope_theta": "qwen2-tiny", "untied": "qwen3-tied-hd64"}


def plant(bug: str, checkpoint: str, out_dir: str | Path) -> Path:
    """``out_dir`` holding ``checkpoint`` (a golden name) with ``bug`` planted."""
    from golden.load import checkpoint_path

    dst = Path(out_dir)
    PLANTED[bug](Path(checkpoint_path(checkpoint)), dst)
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in PLANTED:
        print(f"usage: python -m tools.planted_conversions {{{','.join(PLANTED)}}} CHECKPOINT OUT_DIR", file=sys.stderr)
        sys.exit(2)
    print(plant(*sys.argv[1:]))
