"""Attention backends behind one small interface, chosen by name through a registry ("auto" picks)."""

from __future__ import annotations

from . import flash_attn_backend as fa
from .base import AttentionBackend
from .metadata import AttentionMetadata, forward_context, get_forward_context
from .sdpa_backend import SdpaBackend
from .torch_backend import TorchBackend
from .triton_backend import TritonBackend

BACKENDS: dict[str, type[AttentionBackend]] = {
    "torch": TorchBackend, "sdpa": SdpaBackend, "triton": TritonBackend, "flash-attn": fa.FlashAttnBackend,
}


def resolve_backend_name(name: str, device: str, block_size: int = 16, batch_invariant: bool = False) -> str:
    """"auto": sdpa on the CPU; on CUDA flash-attn when it imports and the block size suits it, else triton. In
    batch-invariant mode "auto" is the fixed-order path of the device: torch on the CPU, triton on CUDA."""
    if name == "auto":
        if device == "cpu":
            return "torch" if batch_invariant else "sdpa"
        fa_fits = fa.flash_attn_available() and block_size % fa.PAGE_MULTIPLE == 0
        return "flash-attn" if fa_fits and not batch_invariant else "triton"
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be 'auto' or one of {sorted(BACKENDS)}, got {name!r}")
    return name


__all__ = [
    "BACKENDS", "AttentionBackend", "AttentionMetadata", "TorchBackend", "forward_context", "get_forward_context",
    "resolve_backend_name",
]
