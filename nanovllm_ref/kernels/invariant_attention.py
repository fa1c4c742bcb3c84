"""Batch-invariant paged attention: each query's reduction over its keys in one fixed order, whatever the batch.

The engine's `batch_invariant=True` mode (kernels/matmul.py lists what it guarantees) needs every query token's
output to depend only on its own sequence's keys, never on the batch around it, the chunk it came in, or whether
it is a decode or a prompt token. Both paths keep the FlashAttention-2 online softmax over key tiles of a fixed
size, starting at key 0, in the same order for every query:

- CUDA: the varlen prefill kernel (kernels/prefill_attention.py) serves every step with a prompt token, decodes
  mixed in included, with one tile (:func:`invariant_prefill_tile`) whatever the query lengths, and a token's tiles
  are the same in any chunk; decode-only steps take the decode kernel unsplit (the default mode's split count
  follows the batch) with the same tile (:func:`invariant_decode_tile`), so the same operations on each row, and
  longest context first (the order programs run in changes no bits; it shortens the last wave). A key
  tile past a query's position is fully masked, which leaves its state bit for bit unchanged (rescale by
  exp2(0) = 1, add 0), so the tiles a longer chunk adds to a tile of queries change nothing.
- CPU (:func:`invariant_attention_reference`, the torch backend's path in this mode): queries in units of a
  fixed number of rows (query tokens x GQA group, :data:`UNIT_ROWS`), keys :data:`KEY_TILE` at a time, every
  product of one fixed shape, so the BLAS computes each row alike wherever it sits.
"""

from __future__ import annotations

import torch

from ._triton_common import triton
from .kv_quant import split_scales
from .prefill_attention import context_rows, gather_contexts

UNIT_ROWS = 16  # query rows (tokens x GQA group) per product on the CPU
KEY_TILE = 32  # keys per online-softmax step on the CPU
# both CUDA kernels in this mode: 64 keys per tile, the decode kernel's 2 warps and 4 stages (decode steps dominate)
CUDA_TILE = {"BLOCK_N": 64, "num_warps": 2, "num_stages": 4}


def invariant_prefill_tile(num_heads: int, num_kv_heads: int) -> dict[str, int]:
    """The one tile_config of the prefill kernel in this mode: CUDA_TILE, and 16 rows (a decode's GQA group padded,
    as the decode kernel's)."""
    block_g = triton.next_power_of_2(num_heads // num_kv_heads)
    return {"BLOCK_Q": max(1, UNIT_ROWS // block_g), **CUDA_TILE}


def invariant_decode_tile() -> dict[str, int]:
    """The decode kernel's tile in this mode (decode-only steps, unsplit, longest context first): the prefill tile's
    keys, warps and stages; its rows match too (the decode kernel pads a GQA group to >= 16 rows, the prefill tile
    holds BLOCK_Q x BLOCK_G = 16, or one group when larger), so a decode token's attention is the prefill kernel's,
    bit for bit (perf/invariant_attention.py of commit 04813df checked it on the GPU; the invariance module checks it
    end to end)."""
    return dict(CUDA_TILE)


def _units(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, tokens: int,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(seq (U,), token row (U, tokens), position (U, tokens)) of each unit of `tokens` query tokens of one sequence;
    rows past a sequence's queries have position -1 (they are dropped) and token row 0."""
    q_lens = query_start_loc.diff().long()
    per_seq = -(-q_lens // tokens)  # (S,) units of each sequence
    seq = torch.repeat_interleave(torch.arange(q_lens.shape[0], device=q_lens.device), per_seq)  # (U,)
    nth = torch.arange(seq.shape[0], device=seq.device) - (per_seq.cumsum(0) - per_seq)[seq]  # unit in its sequence
    offs = nth[:, None] * tokens + torch.arange(tokens, device=seq.device)  # (U, tokens) query index in the sequence
    valid = offs < q_lens[seq, None]
    rows = torch.where(valid, query_start_loc[seq, None].long() + offs, 0)
    return seq, rows, torch.where(valid, (seq_lens.long() - q_lens)[seq, None] + offs, -1)


def invariant_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                                  scale: float, kv_scales: torch.Tensor | None = None) -> torch.Tensor:
    """kernels/prefill_attention.prefill_attention_reference's arguments and result (q's dtype, computed in float32),
    each query's keys reduced in KEY_TILE tiles from key 0, in products of UNIT_ROWS query rows."""
    out = torch.zeros_like(q)
    if q.shape[0] == 0:
        return out
    heads, d = q.shape[1], q.shape[2]
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    tokens = max(1, UNIT_ROWS // group)
    seq, rows, pos = _units(query_start_loc, seq_lens, tokens)  # U units
    tile = KEY_TILE  # never chosen by the batch or the chunk
    width = -(-int(seq_lens.max()) // tile) * tile
    key_pos = torch.arange(width, device=q.device)
    at = context_rows(block_tables, seq_lens, block_size, width, kv_heads)  # past the context: key 0's (finite)
    k_scale, v_scale = split_scales(kv_scales) if kv_scales is not None else (None, None)
    # (S, kv_heads, d, width), (S, kv_heads, width, d)
    k, v = gather_contexts(k_cache, at, k_scale).transpose(2, 3), gather_contexts(v_cache, at, v_scale)
    # (U, kv_heads, tokens * group, d): row t * group + g is token t's query head kvh * group + g
    queries = q.float()[rows].view(-1, tokens, kv_heads, group, d).transpose(1, 2).reshape(-1, kv_heads,
                                                                                        tokens * group, d)
    row_pos = pos.clamp(min=0).repeat_interleave(group, dim=1)[:, None, :, None]  # (U, 1, rows, 1); pad rows: key 0
    m = torch.full((*queries.shape[:3], 1), float("-inf"), device=q.device)
    l, acc = torch.zeros_like(m), torch.zeros_like(queries)
    for j in range(0, width, tile):  # the same tiles in the same order for every query
        s = torch.matmul(queries, k[seq, :, :, j : j + tile]) * scale  # (U, kv_heads, rows, tile)
        s = s.masked_fill(key_pos[j : j + tile] > row_pos, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p, alpha = torch.exp(s - m_new), torch.exp(m - m_new)
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + torch.matmul(p, v[seq, :, j : j + tile])
        m = m_new
    o = (acc / l).view(-1, kv_heads, tokens, group, d).transpose(1, 2).reshape(-1, tokens, heads, d)
    valid = pos >= 0
    out[rows[valid]] = o[valid].to(q.dtype)
    return out
