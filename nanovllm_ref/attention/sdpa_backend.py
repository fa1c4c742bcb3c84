"""The `sdpa` backend, the CPU default: one `scaled_dot_product_attention` call per layer for the whole batch.

The torch reference loops over sequences in Python (a gather, two einsums and a softmax per sequence and
layer); here every sequence's keys are gathered from the paged cache at once by slot index into a padded
`(num_seqs, max_context, kv_heads, head_dim)` tensor, and the queries are padded to `(num_seqs, max_query_len)`,
so a step costs the same few torch calls whatever its batch size (vLLM's CPU backend and transformers' `sdpa`
paged attention also batch this way). Query token i of a sequence sits at position `seq_len - q_len + i`,
so one mask `key_pos <= query_pos` covers fresh prompts, cached prefixes, chunks and decode; a batch of only
fresh prompts takes SDPA's own causal mask instead, which skips the tiles above the diagonal.

Keys past a sequence's context are read from its position 0 instead of whatever the cache holds there (a
freed block may hold another request's NaN): masked scores are zero weights, and zero times NaN would still
poison the sum. Decode batches put a KV head's whole query group in one row block (no K/V repeat); longer
queries use SDPA's `enable_gqa`. Numerically this is the reference up to float rounding (tests/test_sdpa_backend.py
checks it against `prefill_attention_reference` on random paged batches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels.store_kv import store_kv_reference
from .base import AttentionBackend
from .metadata import AttentionMetadata


def gather_keys(
    cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    slots: torch.Tensor,  # (num_seqs, max_context) int64
) -> torch.Tensor:  # (num_seqs, num_kv_heads, max_context, head_dim)
    rows = cache.view(-1, *cache.shape[2:]).index_select(0, slots.view(-1))
    return rows.view(*slots.shape, *cache.shape[2:]).transpose(1, 2)


def context_slots(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """(num_seqs, width * block_size) int64: the cache slot of every key position; past the context, slot 0's."""
    num_seqs, width = block_tables.shape
    slots = (block_tables.long() * block_size)[:, :, None] + torch.arange(block_size, device=block_tables.device)
    slots = slots.view(num_seqs, width * block_size)
    key_pos = torch.arange(slots.shape[1], device=slots.device)
    return torch.where(key_pos < seq_lens[:, None], slots, slots[:, :1])


@dataclass
class Plan:
    """What every layer of one step shares: where the keys are, where each query goes, which mask."""

    slots: torch.Tensor  # (num_seqs, max_context) int64
    mask: torch.Tensor | None  # bool, broadcast to (num_seqs, heads, queries, max_context); None: causal
    seq_of_token: torch.Tensor | None = None  # (num_tokens,): prefill only, a query's sequence...
    row: torch.Tensor | None = None  # ...and its row in the padded queries


def make_plan(meta: AttentionMetadata, num_tokens: int, block_size: int) -> Plan:
    num_seqs, device = meta.seq_lens.shape[0], meta.seq_lens.device
    slots = context_slots(meta.block_tables, meta.seq_lens, block_size)
    key_pos = torch.arange(slots.shape[1], device=device)
    if num_tokens == num_seqs and meta.decode_only:
        return Plan(slots, (key_pos < meta.seq_lens[:, None])[:, None, None, :])  # (num_seqs, 1, 1, ctx)
    q_lens = meta.query_start_loc.diff()  # (num_seqs,)
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens, output_size=num_tokens)
    row = torch.arange(num_tokens, device=device) - meta.query_start_loc[seq_of_token]
    if torch.equal(q_lens, meta.seq_lens):  # fresh prompts only: the plain causal mask is exact for real rows
        return Plan(slots, None, seq_of_token, row)
    query_pos = (meta.seq_lens - q_lens)[:, None] + torch.arange(meta.max_query_len, device=device)
    mask = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]  # (num_seqs, 1, max_q, ctx)
    return Plan(slots, mask, seq_of_token, row)


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        store_kv_reference(k, v, k_cache, v_cache, meta.slot_mapping)

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        plan = meta.derived.get("sdpa")
        if plan is None:
            plan = meta.derived["sdpa"] = make_plan(meta, q.shape[0], k_cache.shape[1])
        num_seqs = plan.slots.shape[0]
        # in float32 like the reference (a no-op for float32 caches): bf16 scores would drift from it
        k, v = gather_keys(k_cache, plan.slots).float(), gather_keys(v_cache, plan.slots).float()  # (s, kvh, ctx, d)
        if plan.seq_of_token is None:  # decode: a KV head's query group shares its row block
            queries = q.float().reshape(num_seqs, self.num_kv_heads, -1, self.head_dim)  # (seqs, kv_heads, group, d)
            out = F.scaled_dot_product_attention(queries, k, v, attn_mask=plan.mask, scale=self.scale)
            return out.reshape(q.shape).to(q.dtype)
        padded = q.new_zeros(num_seqs, meta.max_query_len, *q.shape[1:], dtype=torch.float32)  # (seqs, max_q, h, d)
        padded[plan.seq_of_token, plan.row] = q.float()
        if plan.mask is None:  # fresh prompts: SDPA's causal mask skips the key tiles above the diagonal
            n = meta.max_query_len
            out = F.scaled_dot_product_attention(padded.transpose(1, 2), k[:, :, :n], v[:, :, :n], is_causal=True,
                                                 scale=self.scale, enable_gqa=True)  # (num_seqs, heads, max_q, d)
        else:
            out = F.scaled_dot_product_attention(padded.transpose(1, 2), k, v, attn_mask=plan.mask, scale=self.scale,
                                                 enable_gqa=True)
        return out.transpose(1, 2)[plan.seq_of_token, plan.row].to(q.dtype)
