"""Hypothesis strategies for paged-KV attention batches: property-test any engine's kernels against the
references in `nanovllm_ref.kernels`.

A `PagedBatch` is a self-consistent decode/prefill step: the caches already hold every sequence's whole
context (this step's tokens included, as after store_kv), the queries are the last `q_len` positions of each
sequence, block tables use distinct shuffled block ids, and everything a correct kernel must not read (unused
blocks, rows past `seq_len` in a last block, block-table entries past a sequence's blocks, which point at
unused blocks) is poisoned with NaN (or large finite garbage, `poison="large"`), so a kernel that reads past
`seq_len` produces NaN or a large error. `key`/`value`/`slot_mapping` are this step's K/V rows for store_kv,
with a few padding rows (slot -1, garbage data) mixed in.

Usage:

    from hypothesis import given
    from nanovllm_ref.testing import paged_batches
    from nanovllm_ref.kernels.prefill_attention import prefill_attention_reference

    @given(b=paged_batches(head_dims=(64, 128), gqa_ratios=(1, 4), dtype=torch.float16))
    def test_my_prefill(b):
        ref = prefill_attention_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens,
                                          b.block_tables, b.scale)
        out = my_prefill(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, b.scale)
        assert relative_error(out, ref) < 2e-3

`make_paged_batch(...)` builds one batch of given lengths directly (big shapes, benchmarks), without hypothesis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

POISON_LARGE = 1.0e4  # finite garbage for poison="large": representable in fp16/bf16, dominates any softmax


@dataclass
class PagedBatch:
    q: torch.Tensor  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor  # (num_blocks, block_size, num_kv_heads, head_dim), whole contexts stored
    v_cache: torch.Tensor  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor  # (num_seqs, max_blocks) int32, distinct shuffled ids
    seq_lens: torch.Tensor  # (num_seqs,) int32, context length including this step's tokens
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int32
    slot_mapping: torch.Tensor  # (num_kv_rows,) int32: slots of this step's tokens, -1 on padding rows
    key: torch.Tensor  # (num_kv_rows, num_kv_heads, head_dim): this step's K (= the cache at those slots)
    value: torch.Tensor  # (num_kv_rows, num_kv_heads, head_dim)
    scale: float
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    context_lens: list[int]  # seq_lens as a list
    query_lens: list[int]
    poison: str  # "nan" or "large"

    def __repr__(self) -> str:  # shapes and lengths: what a failing example's report needs, no tensor values
        return (f"PagedBatch({str(self.q.dtype)[6:]}, heads {self.num_heads}/{self.num_kv_heads}, head_dim "
                f"{self.head_dim}, block_size {self.block_size}, context_lens {self.context_lens}, query_lens "
                f"{self.query_lens}, poison {self.poison})")

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    def poisoned_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the caches with this step's slots poisoned: run store_kv on them and they must come back
        equal to `k_cache`/`v_cache`."""
        slots = self.slot_mapping[self.slot_mapping >= 0].long()
        k, v = self.k_cache.clone(), self.v_cache.clone()
        fill = float("nan") if self.poison == "nan" else POISON_LARGE
        k.view(-1, self.num_kv_heads, self.head_dim)[slots] = fill
        v.view(-1, self.num_kv_heads, self.head_dim)[slots] = fill
        return k, v


def _randn(shape: Sequence[int], dtype: torch.dtype, gen: torch.Generator, device: str) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
    x = torch.where(x == 0, torch.full_like(x, 0.25), x)  # never an exact zero (hides missing writes)
    return x.to(dtype)


def make_paged_batch(
    context_lens: Sequence[int],
    query_lens: Sequence[int],
    *,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    extra_blocks: int = 2,
    extra_columns: int = 1,
    num_pad: int = 2,
    poison: str = "nan",
) -> PagedBatch:
    """One PagedBatch with the given per-sequence context and query lengths (1 <= q_len <= ctx)."""
    assert len(context_lens) == len(query_lens) > 0 and poison in ("nan", "large")
    assert all(1 <= q <= c for q, c in zip(query_lens, context_lens)) and extra_blocks >= 1
    device = str(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    cpu_gen = torch.Generator().manual_seed(seed)
    num_seqs = len(context_lens)
    blocks_per_seq = [-(-c // block_size) for c in context_lens]
    used = sum(blocks_per_seq)
    num_blocks = used + extra_blocks
    perm = torch.randperm(num_blocks, generator=cpu_gen)  # distinct, shuffled (never contiguous by design)
    free = perm[used:]
    width = max(blocks_per_seq) + extra_columns
    # entries past a sequence's blocks point at unused (poisoned) blocks
    tables = free[torch.randint(len(free), (num_seqs, width), generator=cpu_gen)]
    offset = 0
    for s, n in enumerate(blocks_per_seq):
        tables[s, :n] = perm[offset : offset + n]
        offset += n
    tables = tables.to(torch.int32)

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = _randn(shape, dtype, gen, device)
    v_cache = _randn(shape, dtype, gen, device)
    valid = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    q_slots = []
    for s, (c, q) in enumerate(zip(context_lens, query_lens)):
        slots = (tables[s, : blocks_per_seq[s], None].long() * block_size + torch.arange(block_size)).flatten()
        valid[slots[:c]] = True
        q_slots.append(slots[c - q : c])
    fill = float("nan") if poison == "nan" else POISON_LARGE
    invalid = (~valid).to(device)
    k_cache.view(-1, num_kv_heads, head_dim)[invalid] = fill
    v_cache.view(-1, num_kv_heads, head_dim)[invalid] = fill

    q_slots_t = torch.cat(q_slots)
    num_tokens = q_slots_t.numel()
    q = _randn((num_tokens, num_kv_heads * group, head_dim), dtype, gen, device)
    # store_kv rows: this step's tokens in order, with num_pad padding rows (-1) inserted at random places
    rows = num_tokens + num_pad
    pad_rows = torch.randperm(rows, generator=cpu_gen)[:num_pad]
    slot_mapping = torch.empty(rows, dtype=torch.int32)
    is_pad = torch.zeros(rows, dtype=torch.bool)
    is_pad[pad_rows] = True
    slot_mapping[is_pad] = -1
    slot_mapping[~is_pad] = q_slots_t.to(torch.int32)
    slot_mapping = slot_mapping.to(device)
    key = _randn((rows, num_kv_heads, head_dim), dtype, gen, device)  # padding rows keep random garbage
    value = _randn((rows, num_kv_heads, head_dim), dtype, gen, device)
    real = (~is_pad).to(device)
    key[real] = k_cache.view(-1, num_kv_heads, head_dim)[q_slots_t.to(device)]
    value[real] = v_cache.view(-1, num_kv_heads, head_dim)[q_slots_t.to(device)]

    qsl = torch.zeros(num_seqs + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(list(query_lens)).cumsum(0)
    return PagedBatch(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables.to(device),
        seq_lens=torch.tensor(list(context_lens), dtype=torch.int32, device=device),
        query_start_loc=qsl.to(device), slot_mapping=slot_mapping, key=key, value=value,
        scale=head_dim**-0.5, num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads, head_dim=head_dim,
        block_size=block_size, context_lens=list(context_lens), query_lens=list(query_lens), poison=poison,
    )


@st.composite
def paged_batches(
    draw: st.DrawFn,
    head_dims: Sequence[int] = (64, 128),
    gqa_ratios: Sequence[int] = (1, 2, 4, 8),
    block_sizes: Sequence[int] = (16, 32, 64, 128, 256),
    num_kv_heads: Sequence[int] = (1, 2),
    max_seqs: int = 4,
    max_context: int = 200,
    decode_only: bool = False,
    dtype: torch.dtype | Sequence[torch.dtype] = torch.float32,
    device: str | torch.device = "cpu",
    poison: str | Sequence[str] = "nan",
) -> PagedBatch:
    """Draw a valid paged batch. Per sequence: context length in [1, max_context] (lengths that are exact
    multiples of the block size and the shortest ones are favoured by a mix of draws), and a query length that
    is 1 (decode), the whole context (empty prefix: a fresh prompt) or anything between (prefix-cache hit or
    chunked prefill); `decode_only` forces q_len 1."""
    kvh = draw(st.sampled_from(list(num_kv_heads)))
    group = draw(st.sampled_from(list(gqa_ratios)))
    head_dim = draw(st.sampled_from(list(head_dims)))
    block_size = draw(st.sampled_from(list(block_sizes)))
    dtypes = [dtype] if isinstance(dtype, torch.dtype) else list(dtype)
    poisons = [poison] if isinstance(poison, str) else list(poison)
    num_seqs = draw(st.integers(1, max_seqs))
    ctx_lens, q_lens = [], []
    for _ in range(num_seqs):
        kind = draw(st.sampled_from(["any", "any", "block_multiple", "short"]))
        if kind == "block_multiple" and block_size <= max_context:
            ctx = block_size * draw(st.integers(1, max_context // block_size))
        elif kind == "short":
            ctx = draw(st.integers(1, min(3, max_context)))
        else:
            ctx = draw(st.integers(1, max_context))
        if decode_only:
            q_len = 1
        else:
            mode = draw(st.sampled_from(["single", "full", "partial"]))
            q_len = {"single": 1, "full": ctx}.get(mode) or draw(st.integers(1, ctx))
        ctx_lens.append(ctx)
        q_lens.append(q_len)
    return make_paged_batch(
        ctx_lens, q_lens, num_kv_heads=kvh, group=group, head_dim=head_dim, block_size=block_size,
        dtype=draw(st.sampled_from(dtypes)), device=device, seed=draw(st.integers(0, 2**31 - 1)),
        extra_blocks=draw(st.integers(1, 3)), extra_columns=draw(st.integers(0, 2)),
        num_pad=draw(st.integers(0, 3)), poison=draw(st.sampled_from(poisons)),
    )


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out has NaN)."""
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


RELATIVE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}
