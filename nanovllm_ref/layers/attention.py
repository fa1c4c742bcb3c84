"""The attention layer: stores this step's K/V in its slice of the paged cache and attends through
the backend, reading the batch metadata from the forward context."""

from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionBackend, AttentionMetadata, get_forward_context
from ..kernels.qkv_epilogue import qkv_epilogue
from .norm import RMSNorm


class Attention(nn.Module):
    def __init__(self, backend: AttentionBackend) -> None:
        super().__init__()
        self.backend = backend
        self.kv_cache: torch.Tensor | None = None  # (2, num_blocks, block_size, num_kv_heads, head_dim)

    def _step(self) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """This layer's K and V caches, and the batch metadata of the step in progress."""
        kv = self.kv_cache
        if kv is None:
            raise RuntimeError("the KV cache is not allocated")
        return kv[0], kv[1], get_forward_context()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q (num_tokens, num_heads, head_dim); k, v (num_tokens, num_kv_heads, head_dim)
        k_cache, v_cache, meta = self._step()
        self.backend.store_kv(k, v, k_cache, v_cache, meta)
        return self.backend.forward(q, k_cache, v_cache, meta)

    def fuses_epilogue(self, x: torch.Tensor) -> bool:
        """Whether `forward_packed` serves this input: on CUDA, with a backend whose KV store is the engine's."""
        return x.is_cuda and self.backend.fused_store_ok

    def forward_packed(self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                       q_norm: RMSNorm | None, k_norm: RMSNorm | None) -> torch.Tensor:
        """Attention from the packed QKV rows, with q/k norm, RoPE and the KV store in one kernel (one launch
        instead of up to six per layer, kernels/qkv_epilogue.py)."""
        k_cache, v_cache, meta = self._step()
        b = self.backend
        weights = (q_norm.weight, k_norm.weight, q_norm.eps) if q_norm is not None else (None, None, 0.0)
        q = qkv_epilogue(qkv, positions, cos_sin_cache, *weights, k_cache, v_cache, meta.slot_mapping,
                         b.num_heads, b.num_kv_heads, b.kv_scales)  # (num_tokens, num_heads, head_dim)
        return b.forward(q, k_cache, v_cache, meta)
