"""The `flash-attn` backend: FlashAttention-2's paged kernels, used when the `flash_attn` package imports.

Prefill (and mixed) batches: `flash_attn_varlen_func` with `block_table`, the K/V being the paged cache itself and
`cu_seqlens_k` the cumulative context lengths; causal masking is aligned to the end of each context (FA >= 2.1),
which is what a cached prefix or a chunked prefill needs. Decode batches: `flash_attn_with_kvcache` with one
query token per sequence, `cache_seqlens` = context lengths (CUDA-graph safe). FA2's paged cache needs pages of
a multiple of 256 tokens, checked up front. K/V are stored by this project's Triton store kernel. The same
pairing as nano-vllm (Yu, 2025); API: Dao, flash-attention `flash_attn_interface.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import FLASH_ATTN_PAGE_MULTIPLE as PAGE_MULTIPLE  # FA2's paged KV cache: pages of 256 tokens
from ..config import flash_attn_available
from .metadata import AttentionMetadata
from .triton_backend import TritonBackend


class FlashAttnBackend(TritonBackend):  # its store_kv: the Triton KV-store kernel
    fp8_kv = False  # FA2 reads 16-bit caches only

    @classmethod
    def check_supported(cls, device: str, block_size: int, head_dim: int) -> None:
        if not flash_attn_available():
            raise ValueError("attention_backend 'flash-attn' needs the flash_attn package (pip install flash-attn)")
        if device != "cuda":
            raise ValueError(f"attention_backend 'flash-attn' runs on CUDA only, not on {device!r}")
        if block_size % PAGE_MULTIPLE:
            raise ValueError(f"attention_backend 'flash-attn' needs kvcache_block_size to be a multiple of "
                             f"{PAGE_MULTIPLE} (its paged KV cache), got {block_size}")
        TritonBackend.check_supported(device, block_size, head_dim)  # the KV store and its head_dim limit

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

        if meta.decode_only:
            # (num_seqs, 1, num_heads, head_dim): one query row per sequence
            return flash_attn_with_kvcache(q.unsqueeze(1), k_cache, v_cache, cache_seqlens=meta.seq_lens,
                                           block_table=meta.block_tables, softmax_scale=self.scale, causal=True)[:, 0]
        cu_seqlens_k = F.pad(meta.seq_lens.cumsum(0, dtype=torch.int32), (1, 0))  # (num_seqs + 1,)
        return flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q=meta.query_start_loc, cu_seqlens_k=cu_seqlens_k,
                                      max_seqlen_q=meta.max_query_len, max_seqlen_k=meta.max_seq_len,
                                      softmax_scale=self.scale, causal=True, block_table=meta.block_tables)
