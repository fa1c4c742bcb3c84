"""The default CUDA backend: this project's Triton kernels (KV store, split-K decode, varlen prefill).

Decode-only batches (every query is one token) take the flash-decoding kernel, which is CUDA-graph safe;
any batch with a longer query takes the varlen prefill kernel, which also serves the decodes mixed in.
On the CPU it runs only under the Triton interpreter (TRITON_INTERPRET=1), which is how CI tests it.
"""

from __future__ import annotations

import os

import torch

from ..kernels.decode_attention import decode_attention
from ..kernels.invariant_attention import invariant_decode_tile, invariant_prefill_tile
from ..kernels.prefill_attention import prefill_attention
from ..kernels.store_kv import store_kv
from .base import AttentionBackend
from .metadata import AttentionMetadata, decode_batch_bucket


class TritonBackend(AttentionBackend):
    fused_store_ok = True
    batch_invariant = False  # the engine's batch_invariant mode: one key tile for every step, no split

    @classmethod
    def check_supported(cls, device: str, block_size: int, head_dim: int) -> None:
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention_backend 'triton' on the CPU needs TRITON_INTERPRET=1")
        if head_dim > 256:
            raise ValueError(f"attention_backend 'triton' supports head_dim <= 256, got {head_dim}")

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping, self.kv_scales)

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        if meta.decode_only:  # batch-invariant mode: the decode kernel unsplit, the prefill tile's bits
            split = (dict(num_splits=1, tile_config=invariant_decode_tile()) if self.batch_invariant else
                     dict(max_seq_len=meta.max_seq_len, split_batch=decode_batch_bucket(q.shape[0])))
            return decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, self.scale,
                                    order=meta.decode_order, kv_scales=self.kv_scales, **split)
        # batch-invariant mode: no batch-dependent split, one tile (kernels/invariant_attention)
        tile = invariant_prefill_tile(self.num_heads, self.num_kv_heads) if self.batch_invariant else None
        return prefill_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                 self.scale, max_query_len=meta.max_query_len, kv_scales=self.kv_scales,
                                 tile_config=tile)
