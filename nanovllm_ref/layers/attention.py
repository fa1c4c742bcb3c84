"""The attention layer: hands the packed QKV rows, this layer's slice of the paged cache and the batch metadata
(from the forward context) to the backend, which owns the whole epilogue (q/k norm, RoPE, KV store) and attention."""

from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionBackend, get_forward_context
from .norm import RMSNorm


class Attention(nn.Module):
    def __init__(self, backend: AttentionBackend, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        self.backend = backend
        self.cos_sin_cache = cos_sin_cache  # (max_positions, head_dim) float32, one table shared by the layers
        self.kv_cache: torch.Tensor | None = None  # (2, num_blocks, block_size, num_kv_heads, head_dim)

    def forward(self, qkv: torch.Tensor, positions: torch.Tensor, q_norm: RMSNorm | None,
                k_norm: RMSNorm | None) -> torch.Tensor:
        """(num_tokens, (heads + 2 * kv_heads) * head_dim) packed QKV rows -> (num_tokens, num_heads, head_dim)."""
        kv = self.kv_cache
        if kv is None:
            raise RuntimeError("the KV cache is not allocated")
        norms = (q_norm.weight, k_norm.weight, q_norm.eps) if q_norm is not None else None
        return self.backend.forward_qkv(qkv, positions, self.cos_sin_cache, norms, kv[0], kv[1], get_forward_context())
