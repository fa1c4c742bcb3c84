"""Paged decode attention over an fp8 (e4m3) KV cache, in Gluon: K and V go from the cache to the tensor cores
without a float16 copy in shared memory (Hopper, sm_90; head_dim 128, GQA groups up to 8).

Same contract as `decode_attention`'s split kernel (kernels/decode_attention.py: one program per sequence, KV head
and split, longest sequences first, partials merged by its reduce kernel), and the same reference,
`decode_attention_reference`. Plain Triton picks the register layouts of `tl.dot`'s operands itself: for V
(whose products want the key axis per thread, while the cache is contiguous along head_dim) it stages a float16
copy in shared memory for a transposing `ldmatrix`, with bank conflicts and at 6 one-warp programs per SM
(perf/RESULTS.md, "What bounds the fp8 decode kernel"). Gluon (triton.experimental.gluon, Triton's dialect with
explicit layouts) lets the kernel choose them:

- The tile's bytes arrive by async copies (`cp.async`, 16 bytes each) in a ring of STAGES shared-memory tiles,
  16-byte chunks XOR-swizzled by row, and are read back with conflict-free 16-byte loads in the layouts below.
- Both products are transposed (`S^T = K Q^T`, `O^T = V^T P^T`, `mma.m16n8k16`): keys or head dims fill the MMA's
  16 rows, the GQA group its 8 columns (kernels/_triton_common.py, SWAP).
- K: a dot product does not care in which order head_dim is summed, so the kernel sums it in the order that makes
  each thread's MMA operand 32 contiguous bytes of a key row (`_k_order`; Q is permuted alike, once): K is read and
  converted in registers, never rearranged.
- V: the output rows may be any permutation of head_dim too (undone at the store), so each thread's operand is 16
  contiguous bytes of each of its 4 keys (`_v_order`). The MMA wants key pairs per 32-bit register: one byte
  permute (`PRMT`) per two registers pairs the keys, and `cvt.rn.f16x2.e4m3x2` converts each pair.
- P goes from the first product's accumulator (keys by row) to the second's operand (keys by column) through a
  small shared-memory scratch, the one layout change with data movement (Triton chooses how).
Every layout change between the loads and the MMAs is asserted free at compile time (`assert_trivial`), and the
swizzle's bank conflicts are 0 for all three access patterns (`gl.bank_conflicts`, tests/kernels).

Gluon has no interpreter: this kernel runs on GPUs only; the CPU path is the Triton kernel beside it.
"""

from __future__ import annotations

import torch

try:  # the Gluon dialect of triton 3.6+ (the "gpu" extra); without it the Triton kernel serves fp8 caches
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    from triton.runtime.jit import constexpr_function
except ImportError:  # pragma: no cover
    gluon = None

HEAD_DIM = 128
# (keys per tile, ring depth): perf/RESULTS.md, "Kernels", the Gluon fp8 decode kernel
FP8_GLUON_TILE = {"BLOCK_N": 32, "STAGES": 3}


def gluon_fp8_decode_ok(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        kv_scales: torch.Tensor | None, out: torch.Tensor, enabled: bool) -> bool:
    """Whether `decode_attention` takes this kernel: `enabled` (the caller's: an sm_90 GPU, the target it is tested
    and tuned on, it needs sm_89+, and neither `NANOVLLM_REF_GLUON=0` nor `NANOVLLM_REF_SLOW_KERNELS=1`, the Triton
    kernel's deliberately slow tiles, the gate demo's regression: env.gluon_fp8_default), an fp8 cache of head_dim
    128 read by 16-bit queries, GQA group <= 8, unit last strides, cache rows 16-byte aligned (its async copies move
    16 bytes)."""
    return (enabled and gluon is not None and kv_scales is not None
            and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] == HEAD_DIM
            and q.shape[1] // k_cache.shape[2] <= 8 and q.stride(-1) == out.stride(-1) == k_cache.stride(-1) == 1
            and all(s % 16 == 0 for s in k_cache.stride()[:3])
            and k_cache.data_ptr() % 16 == v_cache.data_ptr() % 16 == 0)


try:  # a Gluon of another API (triton 3.4-3.5) does not build these: the Triton kernel serves then
    MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    A_OP, B_OP = gl.DotOperandLayout(0, MMA, 2), gl.DotOperandLayout(1, MMA, 2)
    ROWS = gl.BlockedLayout([1, 4], [1, 32], [1, 1], [1, 0])  # Q loads and O stores: a row per 32 lanes
    COPY = gl.BlockedLayout([1, 16], [4, 8], [1, 1], [1, 0])  # the async copies: 16-byte chunks
    RING = gl.SwizzledSharedLayout(vec=16, per_phase=1, max_phase=8, order=[1, 0])
    D: gl.constexpr = gl.constexpr(HEAD_DIM)
    # renamed after triton 3.6 (the old names remain, raising or gone)
    async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
except (NameError, AttributeError, TypeError):
    gluon = None

if gluon is not None:
    @constexpr_function
    def k_layout(n):
        """(n keys, 128 bytes) as the K operand wants them after `_k_order`: lane (groupID, c) holds bytes
        [32c, 32c + 32) of keys groupID + 8i."""
        rows = [[8 << i, 0] for i in range((n // 8).bit_length() - 1)]
        return gl.DistributedLinearLayout([[0, 1], [0, 2], [0, 4], [0, 8], [0, 16]] + rows,
                                          [[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]], [], [], [n, 128])

    @constexpr_function
    def v_layout(n, pairs):
        """(n keys, 128 bytes) as the V^T operand wants them after `_v_order`: lane (groupID, c) holds bytes
        [16 groupID, 16 groupID + 16) of keys 2c, 2c + 1, 2c + 8, 2c + 9 (+ 16i). pairs: the same registers
        regrouped so that four consecutive ones are keys (2c, 2c + 1) x bytes (p, p + 1), one 32-bit word for
        `_e4m3x4_to_f16` (the loads want the 16 bytes of a key consecutive)."""
        p, rows = [[0, 1], [0, 2], [0, 4], [0, 8]], [[8 << i, 0] for i in range((n // 8).bit_length() - 1)]
        regs = [[1, 0]] + p + rows if pairs else p + [[1, 0]] + rows
        return gl.DistributedLinearLayout(regs, [[2, 0], [4, 0], [0, 16], [0, 32], [0, 64]], [], [], [n, 128])

    @gluon.jit
    def _e4m3x4_to_f16(x):
        # four e4m3 (one 32-bit register, in register order) -> four float16: two cvt.rn.f16x2.e4m3x2 (exact)
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [x], dtype=gl.float16, is_pure=True, pack=4)

    @gluon.jit
    def _k_order(x, ROWS_: gl.constexpr):
        # (ROWS_, 128) by byte p -> by summation index d: p = 32c + 2j + e  <->  d = 8j + 2c + e (c < 4, e < 2)
        x = gl.permute(gl.reshape(x, [ROWS_, 4, 16, 2]), [0, 2, 1, 3])
        return gl.reshape(x, [ROWS_, 128])

    @gluon.jit
    def _v_order(x, N: gl.constexpr):
        # (N keys, 128) by byte p -> (128, N keys) by output row d: p = 16g + m  <->  d = 8m + g (g < 8)
        x = gl.permute(gl.reshape(gl.permute(x, [1, 0]), [8, 16, N]), [1, 0, 2])
        return gl.reshape(x, [128, N])

    @gluon.jit
    def _tile_blocks(bt_row, n0, end, BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
        # the cache block of the tile at n0 (a scalar when the tile lies in one block, else one per key); keys
        # past the end take the last key's, or the first entry's for an empty context (their copies are masked off)
        LOG2_BS: gl.constexpr = BLOCK_SIZE.bit_length() - 1  # block sizes are powers of two (EngineConfig)
        if BLOCK_N <= BLOCK_SIZE:
            blk = gl.load(bt_row + (gl.maximum(gl.minimum(n0, end - 1), 0) >> LOG2_BS)).to(gl.int64)
        else:
            keys = gl.arange(0, BLOCK_N, gl.SliceLayout(1, COPY))
            blk = gl.load(bt_row + (gl.maximum(gl.minimum(n0 + keys, end - 1), 0) >> LOG2_BS)).to(gl.int64)
        return blk

    @gluon.jit
    def _copy_tile(k_ring, v_ring, slot, k_base, v_base, blk, n0, end, stride_cb, stride_cs,
                   BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
        keys = gl.arange(0, BLOCK_N, gl.SliceLayout(1, COPY))
        cols = gl.arange(0, D, gl.SliceLayout(0, COPY))
        off = blk * stride_cb + ((n0 + keys) & (BLOCK_SIZE - 1)) * stride_cs
        off = off[:, None] + cols[None, :]
        mask = (n0 + keys < end)[:, None]
        async_load(k_ring.index(slot), k_base + off, mask=mask)
        async_load(v_ring.index(slot), v_base + off, mask=mask)
        async_copy.commit_group()

    @gluon.jit
    def _attend(k_raw, v_raw, n0, end, q_t, acc, l_i, m_i, qk_scale, BLOCK_N: gl.constexpr):
        k = gl.convert_layout(_k_order(_e4m3x4_to_f16(k_raw), BLOCK_N), A_OP, assert_trivial=True)
        s = mma_v2(k, q_t, gl.full([BLOCK_N, 8], 0.0, gl.float32, MMA))  # (BLOCK_N keys, 8 heads): S^T
        keys = gl.arange(0, BLOCK_N, gl.SliceLayout(1, MMA))
        s = gl.where((n0 + keys < end)[:, None], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 0))
        if gl.max(m_new - m_i, 0) > 0:  # rescale only when a running max grew (rare after the first tiles)
            alpha = gl.exp2(m_i - m_new)
            acc = acc * alpha[None, :]
            l_i = l_i * alpha
        p = gl.exp2(s - m_new[None, :])
        l_i = l_i + gl.sum(p, 0)
        p_t = gl.convert_layout(p.to(gl.float16), B_OP)
        v = _e4m3x4_to_f16(gl.convert_layout(v_raw, v_layout(BLOCK_N, True), assert_trivial=True))
        v = gl.convert_layout(_v_order(v, BLOCK_N), A_OP, assert_trivial=True)  # (128, BLOCK_N): V^T
        return mma_v2(v, p_t, acc), l_i, m_new

    @gluon.jit
    def fp8_decode_split_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, kv_scale_ptr, order_ptr, out_ptr,
        part_acc_ptr, part_ml_ptr, qk_scale,  # as decode_attention's _decode_split_kernel
        stride_qs, stride_qh, stride_os, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
        group, num_kv_heads, num_splits,
        BLOCK_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DIRECT_OUT: gl.constexpr,
        HAS_ORDER: gl.constexpr,
    ):
        pid = gl.program_id(0)
        split = pid % num_splits
        kvh = (pid // num_splits) % num_kv_heads
        seq = pid // (num_splits * num_kv_heads)
        if HAS_ORDER:
            seq = gl.load(order_ptr + seq).to(gl.int32)
        seq_len = gl.load(seq_lens_ptr + seq)
        qk_scale = qk_scale * gl.load(kv_scale_ptr + kvh)
        chunk = gl.cdiv(gl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * chunk
        end = gl.minimum(start + chunk, seq_len)

        heads = gl.arange(0, 8, gl.SliceLayout(1, ROWS))
        dims = gl.arange(0, D, gl.SliceLayout(0, ROWS))
        q_off = seq.to(gl.int64) * stride_qs + (kvh * group + heads)[:, None] * stride_qh + dims[None, :]
        q = gl.load(q_ptr + q_off, mask=(heads < group)[:, None], other=0.0).to(gl.float16)
        q_t = gl.convert_layout(gl.permute(_k_order(q, 8), [1, 0]), B_OP)  # (128, 8): Q^T, summed as K

        m_i = gl.full([8], float("-inf"), gl.float32, gl.SliceLayout(0, MMA))
        l_i = gl.full([8], 0.0, gl.float32, gl.SliceLayout(0, MMA))
        acc = gl.full([D, 8], 0.0, gl.float32, MMA)  # O^T, rows in _v_order
        k_base, v_base = k_cache_ptr + kvh * stride_ch, v_cache_ptr + kvh * stride_ch
        bt_row = block_tables_ptr + seq.to(gl.int64) * stride_bt
        k_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D], RING)
        v_ring = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, D], RING)
        for i in gl.static_range(STAGES - 1):
            n = start + i * BLOCK_N
            _copy_tile(k_ring, v_ring, i, k_base, v_base, _tile_blocks(bt_row, n, end, BLOCK_SIZE, BLOCK_N), n, end,
                       stride_cb, stride_cs, BLOCK_SIZE, BLOCK_N)
        # block-table entries are read an iteration before their copies, so no copy waits on one
        blk = _tile_blocks(bt_row, start + (STAGES - 1) * BLOCK_N, end, BLOCK_SIZE, BLOCK_N)
        t = 0
        for n0 in range(start, end, BLOCK_N):
            n_ahead = n0 + (STAGES - 1) * BLOCK_N
            _copy_tile(k_ring, v_ring, (t + STAGES - 1) % STAGES, k_base, v_base, blk, n_ahead, end, stride_cb,
                       stride_cs, BLOCK_SIZE, BLOCK_N)
            blk = _tile_blocks(bt_row, n_ahead + BLOCK_N, end, BLOCK_SIZE, BLOCK_N)
            async_copy.wait_group(STAGES - 1)  # this tile's copies have landed
            thread_barrier()  # ... and are visible to every lane
            k_raw = k_ring.index(t % STAGES).load(k_layout(BLOCK_N))
            v_raw = v_ring.index(t % STAGES).load(v_layout(BLOCK_N, False))
            acc, l_i, m_i = _attend(k_raw, v_raw, n0, end, q_t, acc, l_i, m_i, qk_scale, BLOCK_N)
            t += 1
        async_copy.wait_group(0)  # the copies issued past the end (masked: zero fills) land before the ring is freed
        acc = acc * gl.load(kv_scale_ptr + num_kv_heads + kvh)

        # (8 heads, 128) by head_dim again: d = 8m + g  <->  p = 16g + m
        o = gl.permute(gl.reshape(gl.permute(gl.reshape(acc, [16, 8, 8]), [1, 0, 2]), [D, 8]), [1, 0])
        o = gl.convert_layout(o, ROWS)
        heads = kvh * group + gl.arange(0, 8, gl.SliceLayout(1, ROWS))
        g_mask = (heads < kvh * group + group)[:, None]
        if DIRECT_OUT:
            # seq_len == 0 (a padded batch slot): l = 0, acc = 0 -> output 0, as the reference gives
            l_o = gl.convert_layout(l_i, gl.SliceLayout(1, ROWS))
            o = o / gl.where(l_o > 0, l_o, 1.0)[:, None]
            o_off = seq.to(gl.int64) * stride_os + heads[:, None] * stride_oh + dims[None, :]
            gl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=g_mask)
        else:
            row = (seq.to(gl.int64) * (group * num_kv_heads) + heads) * num_splits + split
            gl.store(part_acc_ptr + row[:, None] * D + dims[None, :], o, mask=g_mask)
            ml_heads = kvh * group + gl.arange(0, 8, gl.SliceLayout(0, MMA))
            ml_row = (seq.to(gl.int64) * (group * num_kv_heads) + ml_heads) * num_splits + split
            ml_mask = ml_heads < kvh * group + group
            gl.store(part_ml_ptr + ml_row * 2, m_i, mask=ml_mask)
            gl.store(part_ml_ptr + ml_row * 2 + 1, l_i, mask=ml_mask)


def launch_fp8_decode(q, k_cache, v_cache, block_tables, seq_lens, kv_scales, order, out, part_acc, part_ml,
                      qk_scale: float, num_splits: int, tile: dict[str, int]) -> None:
    """One launch of `fp8_decode_split_kernel` with decode_attention's arguments (its split kernel's contract)."""
    num_seqs, num_heads, _ = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    fp8_decode_split_kernel[(num_seqs * num_kv_heads * num_splits,)](
        q, k_cache, v_cache, block_tables, seq_lens, kv_scales, seq_lens if order is None else order, out,
        part_acc, part_ml, qk_scale, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        num_heads // num_kv_heads, num_kv_heads, num_splits,
        BLOCK_SIZE=block_size, BLOCK_N=tile["BLOCK_N"], STAGES=tile["STAGES"], DIRECT_OUT=num_splits == 1,
        HAS_ORDER=order is not None, num_warps=1)
