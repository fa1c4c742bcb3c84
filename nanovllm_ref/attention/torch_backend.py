"""The reference backend: pure PyTorch paged attention (CPU and GPU), the numerical reference for the rest."""

from __future__ import annotations

import torch

from ..config import REFERENCE_PLAN, Plan
from ..kernels.invariant_attention import invariant_attention_reference
from ..kernels.prefill_attention import prefill_attention_reference
from ..kernels.store_kv import store_kv_reference
from .base import AttentionBackend
from .metadata import AttentionMetadata


class TorchBackend(AttentionBackend):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 plan: Plan = REFERENCE_PLAN) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale, plan)
        # the engine's batch_invariant mode: kernels/invariant_attention.py
        self.attend = invariant_attention_reference if plan.batch_invariant else prefill_attention_reference

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv_reference(k, v, k_cache, v_cache, meta.slot_mapping, self.kv_scales)

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        return self.attend(
            q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, self.scale, self.kv_scales
        )
