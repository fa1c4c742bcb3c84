"""Attention backends behind one small interface, chosen by name through a registry ("auto" picks)."""

from __future__ import annotations

import importlib.util

from .base import AttentionBackend
from .metadata import AttentionMetadata, forward_context, get_forward_context
from .torch_backend import TorchBackend

BACKENDS: dict[str, str] = {
    "torch": "nanovllm_ref.attention.torch_backend:TorchBackend",
    "sdpa": "nanovllm_ref.attention.sdpa_backend:SdpaBackend",
    "triton": "nanovllm_ref.attention.triton_backend:TritonBackend",
    "flash-attn": "nanovllm_ref.attention.flash_attn_backend:FlashAttnBackend",
}


def resolve_backend_name(name: str, device: str, block_size: int = 16) -> str:
    """"auto": sdpa on the CPU; on CUDA flash-attn when it imports and the block size suits it, else triton."""
    if name == "auto":
        if device == "cpu":
            return "sdpa"
        from .flash_attn_backend import PAGE_MULTIPLE, flash_attn_available

        return "flash-attn" if flash_attn_available() and block_size % PAGE_MULTIPLE == 0 else "triton"
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be 'auto' or one of {sorted(BACKENDS)}, got {name!r}")
    return name


def get_backend_class(name: str) -> type[AttentionBackend]:
    module_name, cls_name = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module_name), cls_name)


__all__ = [
    "AttentionBackend", "AttentionMetadata", "TorchBackend", "forward_context", "get_forward_context",
    "get_backend_class", "resolve_backend_name",
]
