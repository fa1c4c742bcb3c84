"""Paged decode attention: one query token per sequence, attending to its whole cached context.

Triton kernel (`decode_attention`), a split-K "flash-decoding" kernel:
- Decode is memory bound (each KV byte is used by only `group = num_heads // num_kv_heads` query heads), so
  the design goal is to read every KV byte exactly once at full HBM bandwidth.
- GQA: one program owns one (sequence, KV head, split) and all `group` query heads of that KV head, as rows
  of a `(BLOCK_G, head_dim)` query tile padded to >= 16 rows so the two products are `tl.dot`s (tensor cores,
  no per-head re-reads of K/V). The padding costs only idle MMA rows: decode has FLOPs to spare.
- Flash-decoding (Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference", PyTorch blog,
  2023): when batch x KV heads does not fill the GPU, each sequence's context is cut into `num_splits`
  chunks processed by separate programs, each producing an unnormalized partial (max, sum, acc) in float32;
  a small reduce kernel merges them with the log-sum-exp rescaling. Chunks are multiples of BLOCK_N and are
  computed per sequence from its own length on device, so short sequences do not idle long splits.
- `num_splits` is chosen on the host from shapes only (batch x KV heads vs SM count, and an upper bound of
  the context: `max_seq_len` if given, else the block-table width x block size), so the wrapper never syncs
  and allocates only shape-determined buffers: it is CUDA-graph capturable. With one split the kernel
  writes the output directly and the reduce launch is skipped.
- `order` (optional): a permutation telling program i to take sequence order[i]. Longest contexts first
  (longest-processing-time-first scheduling) keeps the last wave of programs short: with mixed context
  lengths, the SMs otherwise idle behind a few long sequences dispatched last. The grid is flat with the
  KV heads (and splits) of one sequence adjacent: on the headline's mixed contexts that read 5% less time
  than a sequence-fastest grid (87% -> 91.5% of the bytes bound, perf/RESULTS.md, "Kernels").
- An fp8 cache (kv_scales given) is read as fp8 and converted in registers to float16, the dtype of both
  products then (the query is cast too: exact for bf16 queries within fp16's range, |q| < 65504): e4m3 ->
  fp16 is one native conversion on sm_89+, while e4m3 -> bf16 is emulated and made the kernel compute bound
  (22.9k vs 25.3k tok/s on the H200 headline, below the bf16 cache). Every e4m3 value is exact in fp16 (float32
  queries keep float32 products). The K scale of the program's KV head is folded into the softmax scale
  and the V scale into the output, one multiply each instead of one per element (kernels/kv_quant.py). On sm_89+
  V is converted by PTX before its shared-memory staging (_triton_common.e4m3x4_to_f16), and the tile is one
  warp, 32 keys and transposed products, three buffers per load when the batch gives every SM 8 programs, else two
  (decode_tile_config).
- On sm_90 GPUs an fp8 cache of head_dim 128 goes to the Gluon kernel beside this one instead
  (kernels/decode_attention_fp8.py: the same grid, splits and reduce, no float16 staging of V); this kernel serves
  the other head sizes, the interpreter and `NANOVLLM_REF_GLUON=0`.
- The fp8 tiles ask for transposed products (`"SWAP": True`, attend_tile's SWAP): the keys become the MMA's 16
  rows and the GQA group its 8 columns (BLOCK_G 8, not 16), half the MMAs and accumulator registers.
- Keys are processed BLOCK_N at a time through the block table (see _triton_common.attend_tile), so any
  page size 16..256 works with the same tile; full tiles load without predicates, only the last is masked.
Related designs: vLLM's Triton unified attention (`triton_unified_attention.py`, which also packs GQA heads
into tile rows) and paged attention v2 (split-K + reduce), FlashAttention-2 for the online softmax.

`NANOVLLM_REF_SLOW_KERNELS=1` (read at each call) deliberately halves BLOCK_N and turns off software
pipelining: perf tests use it to prove that the bandwidth regression gate trips.
"""

from __future__ import annotations

import torch

from .. import env
from ._triton_common import LOG2E, dot_precision, f16_dots, native_e4m3, num_sms, tl, triton, upcast_dots
from .decode_attention_fp8 import FP8_GLUON_TILE, gluon_fp8_decode_ok, launch_fp8_decode
from .prefill_attention import prefill_attention_reference


def decode_attention_reference(
    q: torch.Tensor,  # (num_seqs, num_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    block_tables: torch.Tensor,  # (num_seqs, max_blocks) int32
    seq_lens: torch.Tensor,  # (num_seqs,) int32, context length including the query token
    scale: float,
    kv_scales: torch.Tensor | None = None,  # (2, num_kv_heads) float32: an fp8 cache's K and V scales
) -> torch.Tensor:  # (num_seqs, num_heads, head_dim)
    query_start_loc = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return prefill_attention_reference(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale,
                                       kv_scales)


if triton is not None:
    from ._triton_common import attend_tile

    @triton.jit
    def _decode_split_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
        kv_scale_ptr,  # (2, num_kv_heads) float32 K and V scales (FP8 only)
        order_ptr,  # (num_seqs,) int: the sequence of each program along axis 0 (HAS_ORDER)
        out_ptr,  # (num_seqs, num_heads, head_dim), written only when num_splits == 1
        part_acc_ptr,  # (num_seqs, num_heads, num_splits, HEAD_DIM) f32, unnormalized
        part_ml_ptr,  # (num_seqs, num_heads, num_splits, 2) f32: running max (log2 domain), sum
        qk_scale,
        stride_qs, stride_qh, stride_qd,
        stride_os, stride_oh, stride_od,
        stride_cb, stride_cs, stride_ch, stride_cd,
        stride_bt,
        group, num_kv_heads,
        num_splits,  # runtime, so that split counts do not multiply the compiled variants
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
        HEAD_DIM: tl.constexpr, DIRECT_OUT: tl.constexpr,  # DIRECT_OUT: num_splits == 1, no reduce
        UPCAST: tl.constexpr, PREC: tl.constexpr, HAS_ORDER: tl.constexpr, FP8: tl.constexpr,
        F16_DOTS: tl.constexpr, V_PTX: tl.constexpr,  # V_PTX: an fp8 V converted by PTX (attend_tile)
        SWAP: tl.constexpr = False,  # transposed products (attend_tile), BLOCK_G >= 8
    ):
        # one flat grid, split fastest, then KV head, then sequence: the programs of one sequence run side by
        # side, so their reads of a token's KV heads (adjacent in the cache row) hit the same DRAM pages
        pid = tl.program_id(0)
        split = pid % num_splits
        kvh = (pid // num_splits) % num_kv_heads
        seq = pid // (num_splits * num_kv_heads)
        if HAS_ORDER:
            seq = tl.load(order_ptr + seq).to(tl.int32)
        seq_len = tl.load(seq_lens_ptr + seq)
        if FP8:
            qk_scale = qk_scale * tl.load(kv_scale_ptr + kvh)
        # this split's keys: [start, end); chunk is a multiple of BLOCK_N so only the last tile is partial
        chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * chunk
        end = tl.minimum(start + chunk, seq_len)
        full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N

        offs_g, offs_d = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D)
        heads = kvh * group + offs_g  # (BLOCK_G,) query heads of this KV head
        g_mask, d_mask = offs_g < group, offs_d < HEAD_DIM
        q_off = seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
        q = tl.load(q_ptr + q_off, mask=g_mask[:, None] & d_mask[None, :], other=0.0)  # (BLOCK_G, BLOCK_D)
        if F16_DOTS or V_PTX:
            q = q.to(tl.float16)  # attend_tile converts K and V to q's dtype

        m_i, l_i = tl.full([BLOCK_G], float("-inf"), tl.float32), tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        k_base, v_base = k_cache_ptr + kvh * stride_ch, v_cache_ptr + kvh * stride_ch
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        row_end = tl.full([BLOCK_G], 0, tl.int32) + end
        for n0 in range(start, full_end, BLOCK_N):
            acc, l_i, m_i = attend_tile(
                acc, l_i, m_i, q, k_base, v_base, bt_row, n0, end, row_end, qk_scale, stride_cb, stride_cs,
                stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, False, UPCAST, PREC, V_PTX, SWAP)
        if full_end < end:  # the split's last, partial tile
            acc, l_i, m_i = attend_tile(
                acc, l_i, m_i, q, k_base, v_base, bt_row, full_end, end, row_end, qk_scale, stride_cb, stride_cs,
                stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, True, UPCAST, PREC, V_PTX, SWAP)
        if FP8:
            acc = acc * tl.load(kv_scale_ptr + num_kv_heads + kvh)

        out_mask = g_mask[:, None] & d_mask[None, :]
        if DIRECT_OUT:
            # seq_len == 0 (a padded batch slot): l = 0, acc = 0 -> output 0, as the reference gives
            o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            o_off = seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
            tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            # empty split (context shorter than the splits): m = -inf, l = 0, acc = 0; the reduce weighs it 0
            row = (seq.to(tl.int64) * (group * num_kv_heads) + heads) * num_splits + split  # (BLOCK_G,)
            tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=out_mask)
            tl.store(part_ml_ptr + row * 2, m_i, mask=g_mask)
            tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=g_mask)

    @triton.jit
    def _decode_reduce_kernel(
        part_acc_ptr, part_ml_ptr, out_ptr,
        stride_os, stride_oh, stride_od,
        num_splits,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,  # BLOCK_S >= num_splits
    ):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        s_mask = offs_s < num_splits
        row = (seq.to(tl.int64) * tl.num_programs(1) + head) * num_splits + offs_s  # (BLOCK_S,)
        m = tl.load(part_ml_ptr + row * 2, mask=s_mask, other=float("-inf"))
        l = tl.load(part_ml_ptr + row * 2 + 1, mask=s_mask, other=0.0)
        m_max = tl.max(m, 0)
        m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all splits empty (seq_len 0): avoid -inf - -inf
        w = tl.exp2(m - m_max)  # (BLOCK_S,) each split's rescale factor; 0 for empty splits
        denom = tl.sum(l * w, 0)
        acc = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
                      mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)  # (BLOCK_S, BLOCK_D)
        o = tl.sum(acc * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
        o_off = seq.to(tl.int64) * stride_os + head * stride_oh + offs_d * stride_od
        tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def decode_tile_config(head_dim: int, dtype: torch.dtype, fp8: bool = False,
                       programs_per_sm: float = 0.0, slow: bool | None = None) -> dict[str, int]:
    """BLOCK_N (keys per tile), num_warps, num_stages of the split kernel. programs_per_sm: (sequences x KV heads) /
    SMs of the call (the fp8 tile depends on it); slow: the deliberately slow tiles (None: env.slow_kernels())."""
    if fp8 and head_dim <= 128 and dtype != torch.float32:
        cfg = dict(FP8_DECODE_TILE_WIDE if programs_per_sm >= FP8_WIDE_PROGRAMS_PER_SM else FP8_DECODE_TILE)
    elif head_dim <= 128 and dtype != torch.float32:
        # 2 warps, deep pipeline: the most consistent winner of three H200 sweeps (perf/RESULTS.md); against (64 keys,
        # 4 warps, 3 stages) even at batch 64 / context 2k, +4 to +5 points of copy bandwidth at larger shapes
        cfg = {"BLOCK_N": 64, "num_warps": 2, "num_stages": 4}
    else:
        cfg = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 3}
    if env.slow_kernels() if slow is None else slow:
        cfg = {"BLOCK_N": max(16, cfg["BLOCK_N"] // 2), "num_warps": 4, "num_stages": 1}
    return cfg


# H200, the headline's decode steps 0 / 320 / 640 (256 / 182 / 90 sequences, 8 KV heads, d 128), V converted by PTX
# (_triton_common.e4m3x4_to_f16): (64 keys, 2 warps, 6 stages) 109.4 / 120.0 / 88.4 us, (32, 1, 8) 104.6 / 114.2 / 97.9;
# V converted by Triton (byte-wide shared loads): (64, 2, 4) 117.4 / 129.0 / 96.3, (64, 2, 6) 112.9 / 122.7 / 91.3,
# (64, 2, 8) 124.9 / 133.9 / 97.4, (128, 4, 6) 138.7 / 144.7 / 97.8 (perf/RESULTS.md). Stages 5-6 give each load two
# shared-memory buffers, 8 three (the block-table load before them takes its share of the stages). Transposed products
# ("SWAP": True; triton 3.6 for sm_90, 04813df's sass_report): (32, 1, 8) 168 registers and no stack instead of 255
# and 32 bytes, 542 loop instructions per warp and tile instead of 714 (32 MMAs, not 64). H100, the same steps, one
# call: (32, 1, 8) swapped 117.4 / 130.2 / 105.1 us, (32, 1, 6) swapped 114.7 / 133.6 / 102.4, against the unswapped
# tiles below 121.4 / 136.6 / 109.7 (64, 2, 4 and 64, 2, 6 swapped: 123.6-142.1). The bf16 cache's (64, 2, 4) tile
# gains nothing so: 739 instructions, not 633. Not yet re-timed on an H200.
FP8_DECODE_TILE = {"BLOCK_N": 32, "num_warps": 1, "num_stages": 6, "SWAP": True}
# More programs per SM (the first decode steps of a large batch): three buffers per load win over two
FP8_DECODE_TILE_WIDE = {"BLOCK_N": 32, "num_warps": 1, "num_stages": 8, "SWAP": True}
FP8_WIDE_PROGRAMS_PER_SM = 8


def ptx_fp8_tiles(q: torch.Tensor, kv_scales: torch.Tensor | None) -> bool:
    """An fp8 cache read by 16-bit queries on a GPU with native e4m3 conversion: V converted by PTX (attend_tile)."""
    return kv_scales is not None and q.dtype in (torch.float16, torch.bfloat16) and not upcast_dots(q.device) \
        and native_e4m3(q.device)


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, block_n: int, sms: int) -> int:
    """Split the context only when batch x KV heads leaves SMs idle (a few resident programs per SM hide
    latency); never give a split fewer than 4 tiles of keys (the partial write + reduce would dominate)."""
    units = num_seqs * num_kv_heads
    if units >= 3 * sms:
        return 1
    splits = triton.cdiv(4 * sms, units)
    return max(1, min(splits, max_context // (4 * block_n), 64))


def decode_workspace_numel(num_seqs: int, num_heads: int, head_dim: int, num_splits: int) -> int:
    """float32 elements of the `workspace` tensor `decode_attention` needs for `num_splits` > 1."""
    return num_seqs * num_heads * num_splits * (head_dim + 2)


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float,  # as decode_attention_reference's
    *,
    max_seq_len: int | None = None,  # optional upper bound of seq_lens (only steers num_splits)
    num_splits: int | None = None,  # override the heuristic (tests, tuning)
    split_batch: int | None = None,  # batch size the heuristic sees (a CUDA-graph bucket: eager == graph)
    order: torch.Tensor | None = None,  # (num_seqs,) int permutation: programs take sequences in this order
    out: torch.Tensor | None = None,  # (num_seqs, num_heads, head_dim) preallocated output
    workspace: torch.Tensor | None = None,  # 1-D float32, >= decode_workspace_numel(...) elements
    tile_config: dict[str, int] | None = None,  # override decode_tile_config (benchmark sweeps); "GLUON": 1 with
    # BLOCK_N and STAGES: the fp8 Gluon kernel's tile
    kv_scales: torch.Tensor | None = None,  # (2, num_kv_heads) float32: an fp8 cache's K and V scales
    use_gluon: bool | None = None,  # the Gluon fp8 kernel where it fits (None: env.gluon_fp8_default(q.device))
    slow: bool | None = None,  # the deliberately slow tiles (None: env.slow_kernels())
) -> torch.Tensor:  # (num_seqs, num_heads, head_dim), q's dtype
    """Triton version of `decode_attention_reference`. No host sync, shape-determined allocations only."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert k_cache.stride() == v_cache.stride() and num_heads % num_kv_heads == 0
    group = num_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    if num_seqs == 0:
        return out
    sms = num_sms(q.device)
    units = (split_batch or num_seqs) * num_kv_heads  # a CUDA-graph bucket's batch: eager == graph
    gluon = (bool(tile_config.get("GLUON")) if tile_config is not None
             else gluon_fp8_decode_ok(q, k_cache, v_cache, kv_scales, out,
                                      env.gluon_fp8_default(q.device) if use_gluon is None else use_gluon))
    if gluon:  # an fp8 cache on sm_90: kernels/decode_attention_fp8.py
        cfg = {k: v for k, v in (tile_config or FP8_GLUON_TILE).items() if k != "GLUON"}
    else:
        cfg = dict(tile_config) if tile_config is not None else decode_tile_config(
            head_dim, q.dtype, kv_scales is not None, units / sms, slow)
    block_n, block_g = cfg.pop("BLOCK_N"), max(8 if cfg.get("SWAP") else 16, triton.next_power_of_2(group))
    if num_splits is None:
        max_context = max_seq_len if max_seq_len is not None else block_tables.shape[1] * block_size
        num_splits = decode_num_splits(split_batch or num_seqs, num_kv_heads, max_context, block_n, sms)
    block_d = max(16, triton.next_power_of_2(head_dim))
    if num_splits > 1:
        numel = decode_workspace_numel(num_seqs, num_heads, head_dim, num_splits)
        if workspace is None:
            workspace = torch.empty(numel, dtype=torch.float32, device=q.device)
        assert workspace.dtype == torch.float32 and workspace.numel() >= numel
        part_acc = workspace[: num_seqs * num_heads * num_splits * head_dim]
        part_ml = workspace[part_acc.numel() : numel]
    else:
        part_acc = part_ml = out  # unused
    if gluon:
        launch_fp8_decode(q, k_cache, v_cache, block_tables, seq_lens, kv_scales, order, out, part_acc, part_ml,
                          scale * LOG2E, num_splits, {"BLOCK_N": block_n, **cfg})
    else:
        _decode_split_kernel[(num_seqs * num_kv_heads * num_splits,)](
            q, k_cache, v_cache, block_tables, seq_lens, seq_lens if kv_scales is None else kv_scales,
            seq_lens if order is None else order, out, part_acc, part_ml,
            scale * LOG2E,
            *q.stride(), *out.stride(), *k_cache.stride(), block_tables.stride(0),
            group, num_kv_heads, num_splits,
            BLOCK_SIZE=block_size, BLOCK_N=block_n, BLOCK_G=block_g,
            BLOCK_D=block_d, HEAD_DIM=head_dim, DIRECT_OUT=num_splits == 1,
            UPCAST=upcast_dots(q.device), PREC=dot_precision(q.dtype), HAS_ORDER=order is not None,
            FP8=kv_scales is not None, F16_DOTS=f16_dots(q, kv_scales), V_PTX=ptx_fp8_tiles(q, kv_scales), **cfg,
        )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_acc, part_ml, out, *out.stride(), num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
            HEAD_DIM=head_dim, num_warps=4 if head_dim * num_splits > 2048 else 2,
        )
    return out
