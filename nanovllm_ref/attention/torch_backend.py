"""The reference backend: pure PyTorch paged attention (CPU and GPU), the numerical reference for the rest."""

from __future__ import annotations

import torch

from ..kernels.invariant_attention import invariant_attention_reference
from ..kernels.prefill_attention import prefill_attention_reference
from ..kernels.store_kv import store_kv_reference
from .base import AttentionBackend
from .metadata import AttentionMetadata


class TorchBackend(AttentionBackend):
    batch_invariant = False  # the engine's batch_invariant mode: kernels/invariant_attention.py

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv_reference(k, v, k_cache, v_cache, meta.slot_mapping, self.kv_scales)

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        attend = invariant_attention_reference if self.batch_invariant else prefill_attention_reference
        return attend(
            q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, self.scale, self.kv_scales
        )
