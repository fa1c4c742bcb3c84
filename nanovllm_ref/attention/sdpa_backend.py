"""The `sdpa` backend, the CPU default: float32 attention over keys gathered from the paged cache.

The torch reference loops over sequences in Python (a gather, two einsums and a softmax per sequence and
layer); here every sequence's keys are gathered from the paged cache at once by slot index (one index_select,
`Plan.context_rows`) into a padded `(num_seqs, kv_heads, max_context, head_dim)` tensor. Keys past a sequence's
context are read from its position 0 instead of whatever the cache holds there (a freed block may hold another
request's NaN): masked scores are zero weights, and zero times NaN would still poison the sum.

A decode step (every query one token) attends in one batch: a KV head's whole query group in one row block (no
K/V repeat), two batched matmuls and a softmax (SDPA's flash kernel cost more on one-token queries), one additive
mask made by the first layer for all (`Plan`). A decode step that continues the previous one (same sequences, one
token more each) appends that token to the layer's keys gathered at the previous step instead of gathering the
whole context again (`DecodeContext`). Any other step attends sequence by sequence through SDPA, on views of the
keys (no padding): query token i of a sequence sits at position `seq_len - q_len + i`, so its causal mask is
aligned to the context's end; a batch of fresh prompts reads the rows store_kv kept (from the cache when `forward`
runs alone) through SDPA's causal kernel, which skips the key tiles above the diagonal. Per sequence rather than
padded to the longest query and context: a 256-token chunk beside 31 decodes, 37 vs 322 ms a layer (one CPU
thread, 16 heads of 64 over 4 KV heads); a fresh or cached batch of prompts alike. Numerically this is the
reference up to float rounding (tests/attention/test_sdpa_backend.py checks it against
`prefill_attention_reference` on random paged batches and steps).
An fp8 cache (kv_scales set): the step's K/V are quantized once in store_kv, and every read (this step's rows
included) sees the stored values dequantized in float32 (kernels/kv_quant.py), as the reference does. The cache
is gathered and written through uint8 views (torch's CPU index kernels have no fp8 variants), the rows viewed as
e4m3 again before dequantizing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..kernels.kv_quant import dequantize_kv, quantize_kv, split_scales
from ..kernels.prefill_attention import context_rows, gather_contexts
from .base import AttentionBackend
from .metadata import AttentionMetadata


def as_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x.to(dtype)` without a dispatch when it is already that (a decode step makes dozens of these calls)."""
    return x if x.dtype == dtype else x.to(dtype)


@dataclass
class Plan:
    """What every layer of one step shares: where the keys are and which of them each query sees."""

    tables: torch.Tensor  # (num_seqs, max_blocks) the block tables
    seq_lens: torch.Tensor  # (num_seqs,) context lengths after this step
    block_size: int
    mask: torch.Tensor | None = None  # decode: additive float (seqs * kv_heads, 1, ctx)
    extends: Plan | None = None  # decode: the previous step's plan, when this step appends one token to each row
    carried: bool = True  # decode: whether the next step may extend this one's keys (not a speculative verify step)
    last: torch.Tensor | None = None  # decode: (seqs * kv_heads,) int64 position of each (sequence, KV head)'s new key
    # any other step: each sequence's (first, end) token row, context length and (q_len, seq_len) causal mask, the
    # mask None where the queries are the whole context (SDPA's own causal kernel then)
    spans: list[tuple[int, int, int, torch.Tensor | None]] | None = None
    _rows: dict = field(default_factory=dict)  # context_rows by capacity

    @property
    def width(self) -> int:  # keys per row: max_blocks * block_size
        return self.tables.shape[1] * self.block_size

    def context_rows(self, capacity: int, kv_heads: int) -> torch.Tensor:
        """kernels/prefill_attention.context_rows of this step's contexts in `capacity` keys (past a sequence's
        context, and in the room to grow: its position 0's), made when a step gathers (not every decode step)."""
        if capacity not in self._rows:
            self._rows[capacity] = context_rows(self.tables, self.seq_lens, self.block_size, capacity, kv_heads)
        return self._rows[capacity]


def make_plan(meta: AttentionMetadata, num_tokens: int, block_size: int, num_kv_heads: int,
              prev: Plan | None = None) -> Plan:
    num_seqs, device = meta.seq_lens.shape[0], meta.seq_lens.device
    if num_tokens == num_seqs and meta.decode_only:
        key_pos = torch.arange(meta.block_tables.shape[1] * block_size, device=device)
        # an additive mask, made once here for every layer, one row per (sequence, KV head) as the scores have them
        lens = meta.seq_lens.long().repeat_interleave(num_kv_heads)  # (seqs * kv_heads,)
        mask = torch.where(key_pos >= lens[:, None], -torch.inf, 0.0)[:, None]  # (seqs * kv_heads, 1, ctx)
        # copies: the next step checks itself against these, and its metadata may reuse these tensors in place
        plan = Plan(meta.block_tables.clone(), meta.seq_lens.clone(), block_size, mask, last=lens - 1,
                    carried=not meta.verifies_drafts)
        plan.extends = prev if prev is not None and plan.carried and continues(prev, plan) else None
        return plan
    starts, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
    # query i of q_len sits at position seq_len - q_len + i: it sees the keys up to there (a lower-right causal mask)
    spans = [(a, b, n, None if b - a == n else torch.ones(b - a, n, dtype=torch.bool, device=device).tril(n - (b - a)))
             for a, b, n in zip(starts[:-1], starts[1:], lens)]
    return Plan(meta.block_tables, meta.seq_lens, block_size, spans=spans)


def continues(prev: Plan, plan: Plan) -> bool:
    """Whether decode step `plan` is `prev`'s rows one token on: same sequences, the same cache blocks under every
    key `prev` saw. Then a layer's gathered keys of `prev` plus this step's are this step's context."""
    # (torch.equal is False for another number of sequences)
    if (prev.last is None or not prev.carried or prev.width > plan.width
            or not torch.equal(plan.seq_lens, prev.seq_lens + 1)):
        return False
    blocks = prev.tables.shape[1]  # block j holds keys of prev iff j * block_size < its length
    used = torch.arange(blocks, device=prev.tables.device) * prev.block_size < prev.seq_lens[:, None]
    return torch.equal(plan.tables[:, :blocks].where(used, 0), prev.tables.where(used, 0))


@dataclass
class DecodeContext:
    """One layer's keys and values of the running decode batch, gathered once from the paged cache and then
    appended to step by step, so a decode step reads the cache for its new token only (the cache stays the
    truth: any step that does not continue the previous one gathers afresh)."""

    plan: Plan
    cache_ptr: int
    kt: torch.Tensor  # (num_seqs * kv_heads, head_dim, capacity) float32, keys transposed for the score matmul
    v: torch.Tensor  # (num_seqs * kv_heads, capacity, head_dim) float32; past a row's context: finite filler


class SdpaBackend(AttentionBackend):
    decode_ctx: DecodeContext | None = None  # set per instance
    step_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # the rows store_kv just stored (no padding)

    def store_kv(self, k, v, k_cache, v_cache, meta: AttentionMetadata) -> None:
        slots = as_dtype(meta.slot_mapping, torch.int64)
        if "no_padding" not in meta.derived:  # (a CPU step has no padding rows: one check per step)
            meta.derived["no_padding"] = bool((slots >= 0).all())
        if not meta.derived["no_padding"]:  # rows of slot -1 are padding: neither stored nor attended
            valid = slots >= 0
            k, v, slots = k[valid], v[valid], slots[valid]
        if self.kv_scales is not None:  # attention reads what is stored: the fp8 values, dequantized
            k_scale, v_scale = split_scales(self.kv_scales)
            k, v = quantize_kv(k, k_scale), quantize_kv(v, v_scale)
            self.step_kv = (dequantize_kv(k, k_scale), dequantize_kv(v, v_scale))
            k, v, k_cache, v_cache = (x.view(torch.uint8) for x in (k, v, k_cache, v_cache))
        else:
            self.step_kv = (k, v)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, as_dtype(k, k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, as_dtype(v, v_cache.dtype))

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        step_kv, self.step_kv = self.step_kv, None
        plan = meta.derived.get("sdpa")
        if plan is None:  # the first layer of the step plans for all of them
            prev = self.decode_ctx.plan if self.decode_ctx is not None else None
            plan = meta.derived["sdpa"] = make_plan(meta, q.shape[0], k_cache.shape[1], self.num_kv_heads, prev)
        # in float32 like the reference (a no-op for float32 caches): bf16 scores would drift from it
        if plan.last is not None:  # decode: a KV head's query group shares its row block
            ctx, n = self._decode_context(k_cache, v_cache, plan, step_kv), plan.width
            queries = q.float().reshape(-1, self.num_heads // self.num_kv_heads, self.head_dim)  # (rows, group, d)
            # batched matmuls and an in-place scale and mask (baddbmm's copy of the broadcast mask cost more)
            scores = torch.bmm(queries, ctx.kt[:, :, :n])
            scores = scores.mul_(self.scale).add_(plan.mask)  # (seqs * kv_heads, group, ctx)
            out = torch.bmm(scores.softmax(-1), ctx.v[:, :n])  # (seqs * kv_heads, group, d)
            return as_dtype(out.view(q.shape), q.dtype)
        self.decode_ctx = None
        return self._prompts(q, k_cache, v_cache, plan, step_kv)

    def _gather(self, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: Plan,
                capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(seqs, kv_heads, capacity, head_dim) K and V values of every sequence's context: one index_select each."""
        rows = plan.context_rows(capacity, self.num_kv_heads)
        scales = split_scales(self.kv_scales) if self.kv_scales is not None else (None, None)
        return gather_contexts(k_cache, rows, scales[0]), gather_contexts(v_cache, rows, scales[1])

    def _prompts(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: Plan,
                 step_kv: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """A step with a longer query: each sequence attends over its own keys through SDPA, on views (no padding to
        the longest query or context). Prompts with nothing cached take the keys just stored (the rows store_kv kept)
        and SDPA's causal kernel, which skips the key tiles above the diagonal: measured on the CPU benchmark's
        prefill against padding prompts of similar length into groups, 17 vs 22 ms a layer. Any other step (cached
        prefixes, chunks, decodes mixed in, or a call without store_kv) reads the contexts gathered from the cache."""
        if step_kv is not None and all(mask is None for *_, mask in plan.spans):
            k, v = (x.float().transpose(0, 1)[None] for x in step_kv)  # (1, kv_heads, tokens, d)
            keys = [(k[:, :, a:b], v[:, :, a:b]) for a, b, _, _ in plan.spans]
        else:
            k, v = self._gather(k_cache, v_cache, plan, plan.width)  # (seqs, kv_heads, width, d)
            keys = [(k[s : s + 1, :, :n], v[s : s + 1, :, :n]) for s, (_, _, n, _) in enumerate(plan.spans)]
        queries, outs = q.float().transpose(0, 1)[None], []  # (1, heads, tokens, d)
        for (a, b, _, mask), (k, v) in zip(plan.spans, keys):
            outs.append(F.scaled_dot_product_attention(queries[:, :, a:b], k, v, attn_mask=mask, is_causal=mask is None,
                                                       scale=self.scale, enable_gqa=True)[0].transpose(0, 1))
        return torch.cat(outs).to(q.dtype)  # (num_tokens, heads, d)

    def _decode_context(self, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: Plan,
                        step_kv: tuple[torch.Tensor, torch.Tensor] | None) -> DecodeContext:
        """This layer's keys and values of a decode step: the previous step's plus the token just stored, or,
        when the step does not continue the previous one (or outgrows the room left), gathered afresh."""
        ctx = self.decode_ctx
        if (ctx is not None and plan.extends is ctx.plan and ctx.cache_ptr == k_cache.data_ptr()
                and plan.width <= ctx.v.shape[1] and step_kv is not None):  # (None: called without store_kv)
            rows = torch.arange(plan.last.shape[0], device=plan.last.device)  # each row's new key, at its position
            ctx.kt[rows, :, plan.last] = as_dtype(step_kv[0], torch.float32).reshape(-1, self.head_dim)
            ctx.v[rows, plan.last] = as_dtype(step_kv[1], torch.float32).reshape(-1, self.head_dim)
            ctx.plan = plan
        elif ctx is None or ctx.plan is not plan:
            capacity = plan.width + plan.width // 4 + k_cache.shape[1]  # room to grow by a quarter and a block
            k, v = (x.flatten(0, 1) for x in self._gather(k_cache, v_cache, plan, capacity))  # (rows, capacity, d)
            ctx = self.decode_ctx = DecodeContext(plan, k_cache.data_ptr(), k.transpose(1, 2).contiguous(), v)
        return ctx
