"""Attention backends behind one small interface, chosen by name through a registry ("auto" picks:
config.resolve_backend_name, which knows the registry's names)."""

from __future__ import annotations

from ..config import resolve_backend_name
from . import flash_attn_backend as fa
from .base import AttentionBackend
from .metadata import AttentionMetadata, forward_context, get_forward_context
from .sdpa_backend import SdpaBackend
from .torch_backend import TorchBackend
from .triton_backend import TritonBackend

BACKENDS: dict[str, type[AttentionBackend]] = {
    "torch": TorchBackend, "sdpa": SdpaBackend, "triton": TritonBackend, "flash-attn": fa.FlashAttnBackend,
}


__all__ = [
    "BACKENDS", "AttentionBackend", "AttentionMetadata", "TorchBackend", "forward_context", "get_forward_context",
    "resolve_backend_name",
]
