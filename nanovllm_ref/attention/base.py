"""The attention backend interface: the QKV projection's epilogue (q/k norm, RoPE, this step's K/V into the paged
cache, fp8 quantization there), then attention over the cache.

A backend is built for a plan (config.Plan) and picks its functions then; `forward_qkv` is the one op the model
calls. The default epilogue is the reference's (kernels/qkv_epilogue.py) with the backend's own `store_kv`; a
backend whose store is the engine's Triton store may fuse the whole epilogue into one kernel (triton_backend.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ..config import REFERENCE_PLAN, Plan
from ..kernels.qkv_epilogue import qk_norm_weight, qkv_norm_rope_reference
from ..kernels.rotary import rotary_tables
from .metadata import AttentionMetadata


class AttentionBackend(ABC):
    fused_store_ok = False  # True: store_kv is the reference store (the fused QKV epilogue may replace it)
    fp8_kv = True  # reads and writes an fp8 cache (kernels/kv_quant.py)
    # an fp8 cache's (2, num_kv_heads) float32 K and V scales of this layer, set with the cache; None: not fp8
    kv_scales: torch.Tensor | None = None

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 plan: Plan = REFERENCE_PLAN) -> None:
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.batch_invariant = plan.batch_invariant  # the engine's batch_invariant mode: fixed-order paths
        self.qk_norm_weight: torch.Tensor | None = None  # (heads + kv_heads, head_dim), made on the first call

    @classmethod
    def check_supported(cls, device: str, block_size: int, head_dim: int) -> None:
        """Raise ValueError naming the limit if this backend cannot run the configuration."""

    def forward_qkv(self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                    norms: tuple[torch.Tensor, torch.Tensor, float] | None, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Attention from the packed QKV rows (num_tokens, (heads + 2 * kv_heads) * head_dim): q/k norm (`norms`: q's
        and k's weights and eps, None: no norm), RoPE, the KV store, attention -> (num_tokens, num_heads, head_dim)."""
        derived = meta.derived  # the step's RoPE factors, made by its first layer for all
        cos, sin = derived.get("rope") or (None, None)
        if cos is None:
            cos, sin = derived["rope"] = rotary_tables(positions, cos_sin_cache, qkv.dtype)
        weight = self.qk_norm_weight
        if norms is not None and weight is None:  # made once, after the weights are loaded
            weight = self.qk_norm_weight = qk_norm_weight(norms[0], norms[1], self.num_heads, self.num_kv_heads)
        q, k, v = qkv_norm_rope_reference(qkv, cos, sin, weight, norms[2] if norms else 0.0, self.num_heads,
                                          self.num_kv_heads, self.head_dim)
        self.store_kv(k, v, k_cache, v_cache, meta)
        return self.forward(q, k_cache, v_cache, meta)

    @abstractmethod
    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 meta: AttentionMetadata) -> None: ...

    @abstractmethod
    def forward(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor: ...  # (num_tokens, num_heads, head_dim)
