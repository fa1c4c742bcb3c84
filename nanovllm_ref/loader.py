"""Read a Hugging Face checkpoint folder: its config and tokenizer (transformers' AutoConfig / AutoTokenizer) and
its safetensors weights into a model (safetensors only: never pickle).

The model's `checkpoint_target(name)` maps each checkpoint tensor onto a parameter and the part of it the tensor
fills (q/k/v -> qkv_proj, gate/up -> gate_up_proj, per-expert MoE tensors -> stacked expert parameters); each
parameter's `weight_loader` does the TP slicing and the shape check, and a parameter filled from several tensors
lists their parts in `param.shard_ids` (a tensor for part None fills all of it).
Missing, unexpected, misshapen or unreadable tensors raise a ValueError that names them. On the CPU the loaded
linear weights are then laid out column-major (`column_major_linears`, the plan's `cpu_weight_layout`).
"""

from __future__ import annotations

import glob
import os
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from .layers.linear import LinearBase, load_whole

IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "self_attn.k_scale", "self_attn.v_scale")  # KV scales: kernels/kv_quant.py
LOADABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def load_hf_config(path: str) -> Any:
    from transformers import AutoConfig

    if not os.path.isdir(path):
        raise ValueError(f"model path {path!r} does not exist or is not a folder")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model folder {path!r} has no config.json")
    return AutoConfig.from_pretrained(path, trust_remote_code=False)


def load_tokenizer(path: str) -> Any | None:
    """The checkpoint's tokenizer, or None if it ships none (token-id prompts still work)."""
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if not any(os.path.isfile(os.path.join(path, n)) for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def load_weights(model: nn.Module, path: str) -> None:
    params = dict(model.named_parameters())  # a tied lm_head.weight is embed_tokens.weight: listed once
    tied = getattr(model, "tie_word_embeddings", False)
    loaded: set[tuple[str, object]] = set()  # (parameter, part)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors file in {path!r} (only safetensors checkpoints are loaded)")
    for file in files:
        try:
            with safe_open(file, framework="pt", device="cpu") as f:
                for name in f.keys():
                    if name.endswith(IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                        continue
                    target, shard_id = model.checkpoint_target(name)
                    param = params.get(target)
                    if param is None:
                        raise ValueError(f"checkpoint tensor {name!r} has no counterpart in the model")
                    tensor = f.get_tensor(name)
                    if tensor.dtype not in LOADABLE_DTYPES:
                        raise ValueError(f"checkpoint tensor {name!r} has dtype {tensor.dtype}, which is not "
                                         f"supported (loadable: float32, float16, bfloat16; no quantized weights)")
                    try:
                        getattr(param, "weight_loader", load_whole)(param, tensor, shard_id)
                    except ValueError as e:
                        raise ValueError(f"checkpoint tensor {name!r}: {e}") from None
                    loaded.add((target, shard_id))
        except ValueError:
            raise
        except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
            raise ValueError(f"cannot read {os.path.basename(file)!r} in {path!r}: {e}") from e
    missing = []
    for name, param in params.items():
        if (name, None) not in loaded:  # (a tensor for part None fills every part)
            parts = sorted(getattr(param, "shard_ids", [None]), key=str)
            missing += [name if s is None else f"{name}[{s}]" for s in parts if (name, s) not in loaded]
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint is missing tensors for: {missing[:5]}{more}")


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0, scale: float = 1e-3) -> None:
    """Random weights for benchmarks without a checkpoint (vLLM's load_format="dummy"): uniform in
    [-scale, scale], norms at 1, drawn on the parameters' device so no host memory is needed."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        else:
            param.uniform_(-scale, scale, generator=gen)


@torch.no_grad()
def column_major_linears(model: nn.Module) -> None:
    """Store the linear layers' weights (and an untied LM head's) column-major, once after loading: `x @ W.T` is then
    a plain row-major product for the CPU BLAS, the same sums in the same order (bit for bit here) but 15-25% faster
    on a decode step's few rows. A reload copies into this layout."""
    lm_head = getattr(model, "lm_head", None)
    for m in model.modules():
        if isinstance(m, LinearBase) or (m is lm_head and not getattr(model, "tie_word_embeddings", False)):
            m.weight.data = m.weight.data.t().contiguous().t()
