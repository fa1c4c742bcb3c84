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
queries use SDPA's `enable_gqa`. Two CPU savings (issue 22): a decode step that continues the previous one
(same sequences, one token more each) appends that token to the layer's keys gathered at the previous step
instead of gathering the whole context again (`DecodeContext`), and a batch of fresh prompts attends over the
keys it just stored, not over a gather of them. Numerically this is the reference up to float rounding
(tests/test_sdpa_backend.py checks it against `prefill_attention_reference` on random paged batches and steps).
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
    rows = cache.view(-1, *cache.shape[2:]).index_select(0, slots.reshape(-1))
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
    # broadcast to (num_seqs, heads, queries, max_context): bool, or additive float (decode); None: causal
    mask: torch.Tensor | None
    seq_of_token: torch.Tensor | None = None  # (num_tokens,): prefill only, a query's sequence...
    row: torch.Tensor | None = None  # ...and its row in the padded queries
    seq_lens: torch.Tensor | None = None  # (num_seqs,): decode only, for `continues`
    extends: Plan | None = None  # decode: the previous step's plan, when this step appends one token to each row
    last: tuple[torch.Tensor, torch.Tensor] | None = None  # decode: (row, position) of each row's new token
    # fresh prompts: padded rows ordered longest first, attended in groups of similar length: (start, end, length)
    groups: list[tuple[int, int, int]] | None = None


def make_plan(meta: AttentionMetadata, num_tokens: int, block_size: int, prev: Plan | None = None) -> Plan:
    num_seqs, device = meta.seq_lens.shape[0], meta.seq_lens.device
    slots = context_slots(meta.block_tables, meta.seq_lens, block_size)
    key_pos = torch.arange(slots.shape[1], device=device)
    if num_tokens == num_seqs and meta.decode_only:
        # an additive mask, made once here: a bool one would be turned into this by every layer's SDPA
        mask = torch.zeros(slots.shape, device=device).masked_fill_(key_pos >= meta.seq_lens[:, None], -torch.inf)
        last = (torch.arange(num_seqs, device=device), (meta.seq_lens - 1).long())
        plan = Plan(slots, mask[:, None, None, :], seq_lens=meta.seq_lens, last=last)  # mask (num_seqs, 1, 1, ctx)
        plan.extends = prev if prev is not None and continues(prev, plan) else None
        return plan
    q_lens = meta.query_start_loc.diff()  # (num_seqs,)
    seq_of_token = torch.repeat_interleave(torch.arange(num_seqs, device=device), q_lens, output_size=num_tokens)
    row = torch.arange(num_tokens, device=device) - meta.query_start_loc[seq_of_token]
    if torch.equal(q_lens, meta.seq_lens):  # fresh prompts only: the plain causal mask is exact for real rows
        order, groups = length_groups(q_lens.tolist(), device)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(num_seqs, device=device)
        return Plan(slots[order], None, rank[seq_of_token], row, groups=groups)
    query_pos = (meta.seq_lens - q_lens)[:, None] + torch.arange(meta.max_query_len, device=device)
    mask = (key_pos[None, None, :] <= query_pos[:, :, None])[:, None]  # (num_seqs, 1, max_q, ctx)
    return Plan(slots, mask, seq_of_token, row)


def length_groups(lengths: list[int], device: torch.device, slack: float = 0.05, min_pad: int = 8,
                  ) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
    """Sequences longest first, cut into groups padded to their longest: a row joins the group while its padding
    stays within `min_pad` tokens or `slack` of the group's longest. One padding of every prompt to the longest
    computed about twice the real query rows on a spread of prompt lengths; SDPA calls are cheap next to that
    (measured on the CPU benchmark's prefill: 131 ms at a slack of 0.2, 96 ms at 0.05, 93 ms with no slack).
    Returns (order, [(first row, end row, length)])."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups, start = [], 0
    for i in range(1, len(order) + 1):
        longest = lengths[order[start]]
        if i == len(order) or longest - lengths[order[i]] > max(min_pad, slack * longest):
            groups.append((start, i, longest))
            start = i
    return torch.tensor(order, device=device), groups


def continues(prev: Plan, plan: Plan) -> bool:
    """Whether decode step `plan` is `prev`'s rows one token on: same sequences, same cache slots for every key
    `prev` saw. Then a layer's gathered keys of `prev` plus this step's are this step's context."""
    if prev.seq_lens is None or prev.slots.shape[0] != plan.slots.shape[0] or prev.slots.shape[1] > plan.slots.shape[1]:
        return False
    if not torch.equal(plan.seq_lens, prev.seq_lens + 1):
        return False
    seen = torch.arange(prev.slots.shape[1], device=prev.slots.device) < prev.seq_lens[:, None]  # (seqs, prev ctx)
    return torch.equal(plan.slots[:, : seen.shape[1]].where(seen, 0), prev.slots.where(seen, 0))


@dataclass
class DecodeContext:
    """One layer's keys and values of the running decode batch, gathered once from the paged cache and then
    appended to step by step, so a decode step reads the cache for its new token only (the cache stays the
    truth: any step that does not continue the previous one gathers afresh)."""

    plan: Plan
    cache_ptr: int
    k: torch.Tensor  # (num_seqs, capacity, kv_heads, head_dim) float32; past a row's context: finite filler
    v: torch.Tensor


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, scale)
        self.decode_ctx: DecodeContext | None = None
        self.step_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # the k, v rows store_kv just stored

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        self.step_kv = (k, v)
        no_padding = meta.derived.get("no_padding")
        if no_padding is None:  # (a CPU step has no padding rows: one check per step, then one copy per tensor)
            no_padding = meta.derived["no_padding"] = bool((meta.slot_mapping >= 0).all())
        if not no_padding:
            return store_kv_reference(k, v, k_cache, v_cache, meta.slot_mapping)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, meta.slot_mapping.long(), k.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, meta.slot_mapping.long(), v.to(v_cache.dtype))

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        step_kv, self.step_kv = self.step_kv, None
        plan = meta.derived.get("sdpa")
        if plan is None:  # the first layer of the step plans for all of them
            prev = self.decode_ctx.plan if self.decode_ctx is not None else None
            plan = meta.derived["sdpa"] = make_plan(meta, q.shape[0], k_cache.shape[1], prev)
        num_seqs = plan.slots.shape[0]
        # in float32 like the reference (a no-op for float32 caches): bf16 scores would drift from it
        if plan.seq_of_token is None:  # decode: a KV head's query group shares its row block
            ctx, n = self._decode_context(k_cache, v_cache, plan, step_kv), plan.slots.shape[1]
            k, v = ctx.k[:, :n].transpose(1, 2), ctx.v[:, :n].transpose(1, 2)  # (seqs, kv_heads, ctx, d)
            queries = q.float().reshape(num_seqs, self.num_kv_heads, -1, self.head_dim)  # (seqs, kv_heads, group, d)
            out = F.scaled_dot_product_attention(queries, k, v, attn_mask=plan.mask, scale=self.scale)
            return out.reshape(q.shape).to(q.dtype)
        self.decode_ctx = None
        padded = q.new_zeros(num_seqs, meta.max_query_len, *q.shape[1:], dtype=torch.float32)  # (seqs, max_q, h, d)
        padded[plan.seq_of_token, plan.row] = q.float()
        if plan.mask is None:  # fresh prompts: SDPA's causal mask skips the key tiles above the diagonal
            n = meta.max_query_len
            if step_kv is not None and step_kv[0].shape[0] == q.shape[0]:  # the keys just stored are all there is
                keys, values = (self._padded(x, plan, n) for x in step_kv)
            else:
                keys, values = (gather_keys(c, plan.slots[:, :n]).float() for c in (k_cache, v_cache))
            queries, out = padded.transpose(1, 2), padded.new_empty(num_seqs, q.shape[1], n, self.head_dim)
            for a, b, n in plan.groups:  # (num_seqs, heads, max_q, d); rows past a group's length stay unset
                k, v = keys[a:b, :, :n], values[a:b, :, :n]
                out[a:b, :, :n] = F.scaled_dot_product_attention(queries[a:b, :, :n], k, v, is_causal=True,
                                                                 scale=self.scale, enable_gqa=True)
        else:
            k, v = gather_keys(k_cache, plan.slots).float(), gather_keys(v_cache, plan.slots).float()
            out = F.scaled_dot_product_attention(padded.transpose(1, 2), k, v, attn_mask=plan.mask, scale=self.scale,
                                                 enable_gqa=True)
        return out.transpose(1, 2)[plan.seq_of_token, plan.row].to(q.dtype)

    def _decode_context(self, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: Plan,
                        step_kv: tuple[torch.Tensor, torch.Tensor] | None) -> DecodeContext:
        """This layer's keys and values of a decode step: the previous step's plus the token just stored, or,
        when the step does not continue the previous one (or outgrows the room left), gathered afresh."""
        ctx = self.decode_ctx
        if (ctx is not None and plan.extends is ctx.plan and ctx.cache_ptr == k_cache.data_ptr()
                and plan.slots.shape[1] <= ctx.k.shape[1]):
            if step_kv is None or step_kv[0].shape[0] != plan.slots.shape[0]:  # not one row per sequence
                new = plan.slots[plan.last]  # (num_seqs,) this step's slots
                step_kv = (k_cache.view(-1, *k_cache.shape[2:])[new], v_cache.view(-1, *v_cache.shape[2:])[new])
            ctx.k[plan.last], ctx.v[plan.last] = step_kv[0].float(), step_kv[1].float()
            ctx.plan = plan
        elif ctx is None or ctx.plan is not plan:
            width = plan.slots.shape[1]
            spare = plan.slots[:, :1].expand(-1, width // 4 + k_cache.shape[1])  # finite filler: position 0's
            slots = torch.cat([plan.slots, spare], dim=1)  # (num_seqs, capacity)
            k, v = gather_keys(k_cache, slots).float(), gather_keys(v_cache, slots).float()
            ctx = self.decode_ctx = DecodeContext(plan, k_cache.data_ptr(), k.transpose(1, 2), v.transpose(1, 2))
        return ctx

    @staticmethod
    def _padded(x: torch.Tensor, plan: Plan, max_q: int) -> torch.Tensor:  # (tokens, kvh, d) -> (seqs, kvh, max_q, d)
        padded = x.new_zeros(plan.slots.shape[0], max_q, *x.shape[1:], dtype=torch.float32)
        padded[plan.seq_of_token, plan.row] = x.float()
        return padded.transpose(1, 2)
