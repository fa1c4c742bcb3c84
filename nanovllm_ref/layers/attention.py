"""The attention layer: stores this step's K/V in its slice of the paged cache and attends through
the backend, reading the batch metadata from the forward context."""

from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionBackend, get_forward_context


class Attention(nn.Module):
    def __init__(self, backend: AttentionBackend) -> None:
        super().__init__()
        self.backend = backend
        self.kv_cache: torch.Tensor | None = None  # (2, num_blocks, block_size, num_kv_heads, head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q (num_tokens, num_heads, head_dim); k, v (num_tokens, num_kv_heads, head_dim)
        if self.kv_cache is None:
            raise RuntimeError("the KV cache is not allocated")
        meta = get_forward_context()
        k_cache, v_cache = self.kv_cache[0], self.kv_cache[1]
        self.backend.store_kv(k, v, k_cache, v_cache, meta)
        return self.backend.forward(q, k_cache, v_cache, meta)
