"""The default CUDA backend: this project's Triton kernels (KV store, split-K decode, varlen prefill).

Decode-only batches (every query is one token) take the flash-decoding kernel, which is CUDA-graph safe;
any batch with a longer query takes the varlen prefill kernel, which also serves the decodes mixed in.
On the CPU it runs only under the Triton interpreter (TRITON_INTERPRET=1), which is how CI tests it. On CUDA
(the plan's `fused_epilogue`) the QKV epilogue is one kernel (kernels/qkv_epilogue.py), else the reference's
steps with this backend's KV-store kernel.
"""

from __future__ import annotations

import torch

from .. import env
from ..config import REFERENCE_PLAN, Plan
from ..kernels.decode_attention import decode_attention
from ..kernels.invariant_attention import invariant_decode_tile, invariant_prefill_tile
from ..kernels.prefill_attention import prefill_attention
from ..kernels.qkv_epilogue import qkv_epilogue
from ..kernels.store_kv import store_kv
from .base import AttentionBackend
from .metadata import AttentionMetadata, decode_batch_bucket


class TritonBackend(AttentionBackend):
    fused_store_ok = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 plan: Plan = REFERENCE_PLAN) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale, plan)
        # batch_invariant (the base's): one key tile for every step, no split
        self.fuses_epilogue = plan.fused_epilogue and self.fused_store_ok
        self.use_gluon, self.slow = plan.gluon_fp8_decode, plan.slow_kernels

    @classmethod
    def check_supported(cls, device: str, block_size: int, head_dim: int) -> None:
        if device == "cpu" and not env.triton_interpret():
            raise ValueError("attention_backend 'triton' on the CPU needs TRITON_INTERPRET=1")
        if head_dim > 256:
            raise ValueError(f"attention_backend 'triton' supports head_dim <= 256, got {head_dim}")

    def forward_qkv(self, qkv, positions, cos_sin_cache, norms, k_cache, v_cache, meta: AttentionMetadata):
        if not self.fuses_epilogue:
            return super().forward_qkv(qkv, positions, cos_sin_cache, norms, k_cache, v_cache, meta)
        # q/k norm, RoPE and the KV store in one kernel: one launch instead of up to six per layer
        weights = norms if norms is not None else (None, None, 0.0)
        q = qkv_epilogue(qkv, positions, cos_sin_cache, *weights, k_cache, v_cache, meta.slot_mapping,
                         self.num_heads, self.num_kv_heads, self.kv_scales)  # (num_tokens, num_heads, head_dim)
        return self.forward(q, k_cache, v_cache, meta)

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping, self.kv_scales)

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        if meta.decode_only:  # batch-invariant mode: the decode kernel unsplit, the prefill tile's bits
            split = (dict(num_splits=1, tile_config=invariant_decode_tile()) if self.batch_invariant else
                     dict(max_seq_len=meta.max_seq_len, split_batch=decode_batch_bucket(q.shape[0])))
            return decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, self.scale,
                                    order=meta.decode_order, kv_scales=self.kv_scales, use_gluon=self.use_gluon,
                                    slow=self.slow, **split)
        # batch-invariant mode: no batch-dependent split, one tile (kernels/invariant_attention)
        tile = invariant_prefill_tile(self.num_heads, self.num_kv_heads) if self.batch_invariant else None
        return prefill_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                                 self.scale, max_query_len=meta.max_query_len, kv_scales=self.kv_scales,
                                 tile_config=tile)
