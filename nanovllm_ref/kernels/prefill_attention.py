"""Causal attention of packed variable-length queries over a paged KV cache.

Covers every case with one definition: a fresh prompt (q_len == seq_len), a prompt whose prefix came from
the prefix cache or an earlier chunk (q_len < seq_len: the queries are the last q_len positions), and
decode (q_len == 1). The K/V of this step's tokens must already be in the cache (see store_kv).

Triton kernel (`prefill_attention`): one launch for the whole varlen batch, FlashAttention-2 style
(Dao 2023; the Triton fused-attention tutorial) with the keys gathered from the paged cache:
- Grid (query tiles, KV heads, sequences). A program owns BLOCK_Q query tokens x all `group` query heads of
  one KV head, packed as BLOCK_M = BLOCK_Q * BLOCK_G rows (row r = token r // BLOCK_G, head r % BLOCK_G), as
  vLLM's Triton unified attention does: each K/V tile read from the cache serves the whole GQA group, and
  short queries (chunked prefill tails, q_len 1) still fill the MMA rows.
- Query token i of a sequence sits at position `seq_len - q_len + i`, so a cached prefix is just keys that
  every query sees. Key tiles entirely below the tile's first query position are processed without any mask;
  only the tiles crossing the causal diagonal (at most ceil(BLOCK_Q / BLOCK_N) + 1) pay for masking.
- Tiles are launched heaviest first (the grid's first axis is reversed): under causal masking the last query
  tiles have the most keys, and starting them first shortens the tail of the launch.
- Programs past a sequence's queries exit at once; `max_query_len` only sizes the grid (and lets small
  queries use a smaller BLOCK_Q). When it is None it is read from `query_start_loc` with a host sync, which
  is fine since prefill is never captured in a CUDA graph.
- Softmax statistics and the accumulator are float32; P is cast to the K/V dtype for the PV product.
- An fp8 cache (kv_scales given): read as fp8, converted to float16 in registers (as the query, see
  kernels/decode_attention.py), the KV head's K scale
  folded into the softmax scale and its V scale into the output, as in kernels/decode_attention.py.
"""

from __future__ import annotations

import torch

from ._triton_common import LOG2E, dot_precision, f16_dots, hopper, tl, triton, upcast_dots
from .kv_quant import FP8, dequantize_kv, split_scales


def context_rows(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, width: int,
                 kv_heads: int) -> torch.Tensor:
    """(num_seqs, kv_heads, width) int64: the row of each (sequence, KV head, key position) in a cache viewed as
    (slots * kv_heads, head_dim), so that one index_select gathers every context (`gather_contexts`). Past a
    sequence's context, its position 0's: finite filler (a freed block may hold another request's NaN, and a masked
    key's zero weight times NaN would still poison the sum)."""
    key_pos = torch.arange(width, device=block_tables.device)
    blocks = (key_pos // block_size).clamp(max=block_tables.shape[1] - 1)
    slots = block_tables.long()[:, blocks] * block_size + key_pos % block_size  # (seqs, width)
    slots = torch.where(key_pos < seq_lens[:, None], slots, slots[:, :1])
    return slots[:, None, :] * kv_heads + torch.arange(kv_heads, device=slots.device)[:, None]


def gather_contexts(cache: torch.Tensor, rows: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """(num_seqs, kv_heads, width, head_dim) float32 values of a paged cache at `rows` (`context_rows`); an fp8
    cache's dequantized by its (kv_heads,) `scale`, read through a uint8 view (torch's CPU index kernels have no fp8
    variants)."""
    raw = cache.view(torch.uint8) if scale is not None else cache
    x = raw.view(-1, cache.shape[-1]).index_select(0, rows.view(-1)).view(*rows.shape, -1)
    return x.float() if scale is None else dequantize_kv(x.view(FP8), scale, heads_axis=1)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int,
              scale: torch.Tensor | None = None) -> torch.Tensor:
    """The first `seq_len` tokens of one sequence from a paged cache: (seq_len, num_kv_heads, head_dim) float32
    values (an fp8 cache's dequantized by its (num_kv_heads,) `scale`)."""
    num_blocks = -(-seq_len // cache.shape[1])
    x = cache[block_table[:num_blocks].long()].flatten(0, 1)[:seq_len]
    return x.float() if scale is None else dequantize_kv(x, scale)


def prefill_attention_reference(
    q: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    query_start_loc: torch.Tensor,  # (num_seqs + 1,) int32
    seq_lens: torch.Tensor,  # (num_seqs,) int32, context length including the queries
    block_tables: torch.Tensor,  # (num_seqs, max_blocks) int32
    scale: float,
    kv_scales: torch.Tensor | None = None,  # (2, num_kv_heads) float32: an fp8 cache's K and V scales
) -> torch.Tensor:  # (num_tokens, num_heads, head_dim), q's dtype; computed in float32
    out = torch.empty_like(q)
    k_scale, v_scale = split_scales(kv_scales) if kv_scales is not None else (None, None)
    group = q.shape[1] // k_cache.shape[2]
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for s, seq_len in enumerate(lens):
        q_start, q_end = starts[s], starts[s + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        # (seq_len, num_heads, head_dim): each KV head's values repeated for its query heads
        k = gather_kv(k_cache, block_tables[s], seq_len, k_scale).repeat_interleave(group, dim=1)
        v = gather_kv(v_cache, block_tables[s], seq_len, v_scale).repeat_interleave(group, dim=1)
        qs = q[q_start:q_end].float()
        scores = torch.einsum("qhd,khd->hqk", qs, k) * scale  # (num_heads, q_len, seq_len)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        scores.masked_fill_(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = scores.softmax(dim=-1)
        out[q_start:q_end] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


if triton is not None:
    from ._triton_common import attend_tile

    # stride_bt is the widest block table of the step: specializing on it (== 1, % 16) would compile new
    # variants mid-run as prompt lengths change
    @triton.jit(do_not_specialize=["stride_bt"])
    def _prefill_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
        kv_scale_ptr,  # (2, num_kv_heads) float32 K and V scales (FP8 only)
        qk_scale,
        stride_qt, stride_qh, stride_qd,
        stride_ot, stride_oh, stride_od,
        stride_cb, stride_cs, stride_ch, stride_cd,
        stride_bt,
        group, num_kv_heads,
        BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
        UPCAST: tl.constexpr, PREC: tl.constexpr, FP8: tl.constexpr, F16_DOTS: tl.constexpr,
    ):
        # BLOCK_M = BLOCK_Q * BLOCK_G rows
        tile = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest (last) query tiles first
        kvh = tl.program_id(1)
        seq = tl.program_id(2)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        m0 = tile * BLOCK_Q  # first query token (index within this sequence's queries) of the tile
        if m0 >= q_len:
            return
        seq_len = tl.load(seq_lens_ptr + seq)
        prefix = seq_len - q_len  # keys already in the cache before this step's queries
        if FP8:
            qk_scale = qk_scale * tl.load(kv_scale_ptr + kvh)

        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        tok = m0 + offs_m // BLOCK_G  # (BLOCK_M,) query token of each row
        head = kvh * group + offs_m % BLOCK_G  # (BLOCK_M,) query head of each row
        row_mask = (tok < q_len) & (offs_m % BLOCK_G < group)
        d_mask = offs_d < HEAD_DIM
        tok64 = (q_start + tok).to(tl.int64)
        q_off = tok64[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd
        q = tl.load(q_ptr + q_off, mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
        if F16_DOTS:
            q = q.to(tl.float16)  # attend_tile converts K and V to q's dtype

        # keys visible to row r: pos <= prefix + tok[r] (causal) and pos < seq_len (rows past q_len)
        row_end = tl.minimum(prefix + tok + 1, seq_len)
        # [0, full_end): visible to every row, no mask; [full_end, kv_end): the causal diagonal, masked.
        # The first tile processed always has key 0 <= every row's position, so no row starts all -inf.
        full_end = (prefix + m0 + 1) // BLOCK_N * BLOCK_N
        kv_end = tl.minimum(prefix + m0 + BLOCK_Q, seq_len)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = k_cache_ptr + kvh * stride_ch
        v_base = v_cache_ptr + kvh * stride_ch
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for n0 in range(0, full_end, BLOCK_N):
            acc, l_i, m_i = attend_tile(
                acc, l_i, m_i, q, k_base, v_base, bt_row, n0, kv_end, row_end, qk_scale,
                stride_cb, stride_cs, stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, False, UPCAST, PREC, False)
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, l_i, m_i = attend_tile(
                acc, l_i, m_i, q, k_base, v_base, bt_row, n0, kv_end, row_end, qk_scale,
                stride_cb, stride_cs, stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, True, UPCAST, PREC, False)

        if FP8:
            acc = acc * tl.load(kv_scale_ptr + num_kv_heads + kvh)
        # l_i >= 1 in every row (its maximal key contributes exp2(0)); 0 only for a padded graph slot (no keys)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_off = tok64[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def prefill_tile_config(head_dim: int, dtype: torch.dtype, group: int, max_query_len: int,
                        sm90: bool = False) -> dict[str, int]:
    """Tile shape: ~128 query rows (64 for fp32 or head_dim > 128, to fit registers/shared memory), never
    more query tokens per tile than the longest query needs. `sm90`: the GPU is an H100 / H200."""
    block_g = triton.next_power_of_2(group)
    block_q = max(1, (128 if head_dim <= 128 and dtype != torch.float32 else 64) // block_g)
    # short queries (e.g. decodes mixed with a short chunk): a smaller BLOCK_Q, but >= 16 MMA rows
    # only two variants (long / short queries), so a run compiles the kernel at most twice
    if max_query_len <= 16:
        block_q = max(min(block_q, 16), triton.cdiv(16, block_g))
    if sm90 and block_q * block_g >= 128:
        # 64 keys, 4 warps, 3 stages: 0.60-0.81x the time of 32 keys / 8 warps / 2 stages on sm_90 (perf/RESULTS.md,
        # "Kernels": five prompt mixes, bf16 and fp8 caches, head_dim 64 and 128, GQA 2 and 4); 130 KB of shared
        # memory, more than other GPUs may have, where the smaller tile stays
        return {"BLOCK_Q": block_q, "BLOCK_G": block_g, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    return {
        "BLOCK_Q": block_q, "BLOCK_G": block_g, "BLOCK_N": 32,
        "num_warps": 8 if block_q * block_g >= 128 or head_dim > 128 else 4, "num_stages": 2,
    }


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor, block_tables: torch.Tensor, scale: float,  # as prefill_attention_reference's
    max_query_len: int | None = None,  # longest q_len of the batch; read from query_start_loc if None
    *,
    out: torch.Tensor | None = None,  # (num_tokens, num_heads, head_dim) preallocated output
    tile_config: dict[str, int] | None = None,  # entries over prefill_tile_config's (batch_invariant mode's one tile)
    kv_scales: torch.Tensor | None = None,  # (2, num_kv_heads) float32: an fp8 cache's K and V scales
) -> torch.Tensor:  # (num_tokens, num_heads, head_dim), q's dtype
    """Triton version of `prefill_attention_reference`, one launch for all sequences."""
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert k_cache.stride() == v_cache.stride() and num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    if num_tokens == 0 or seq_lens.shape[0] == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())  # host sync
    cfg = {**prefill_tile_config(head_dim, q.dtype, group, max_query_len, hopper(q.device)), **(tile_config or {})}
    grid = (triton.cdiv(max_query_len, cfg["BLOCK_Q"]), num_kv_heads, seq_lens.shape[0])
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, query_start_loc, seq_lens, block_tables,
        seq_lens if kv_scales is None else kv_scales, scale * LOG2E,
        *q.stride(), *out.stride(), *k_cache.stride(), block_tables.stride(0),
        group, num_kv_heads,
        BLOCK_SIZE=block_size, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), HEAD_DIM=head_dim,
        UPCAST=upcast_dots(q.device), PREC=dot_precision(q.dtype),
        FP8=kv_scales is not None, F16_DOTS=f16_dots(q, kv_scales), BLOCK_M=cfg["BLOCK_Q"] * cfg["BLOCK_G"], **cfg,
    )
    return out
