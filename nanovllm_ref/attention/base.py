"""The attention backend interface: store this step's K/V in the paged cache, then attend over it."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from .metadata import AttentionMetadata


class AttentionBackend(ABC):
    fused_store_ok = False  # True: store_kv is the reference store (the fused QKV epilogue may replace it)
    fp8_kv = True  # reads and writes an fp8 cache (kernels/kv_quant.py)
    # an fp8 cache's (2, num_kv_heads) float32 K and V scales of this layer, set with the cache; None: not fp8
    kv_scales: torch.Tensor | None = None

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale

    @classmethod
    def check_supported(cls, device: str, block_size: int, head_dim: int) -> None:
        """Raise ValueError naming the limit if this backend cannot run the configuration."""

    @abstractmethod
    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None: ...

    @abstractmethod
    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor: ...  # (num_tokens, num_heads, head_dim)
