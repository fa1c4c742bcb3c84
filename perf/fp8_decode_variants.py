"""Experimental variants of the FP8-cache decode kernel, for perf/fp8_decode_sweep.py (not used by the engine).

Same grid, split-K partials and reduce as kernels/decode_attention.py; products in float16 (every e4m3 value is
exact there), the K scale folded into the softmax scale and the V scale into the output. `CVT` picks how a tile
becomes float16:
- 0: `.to(float16)`, as the engine's kernel does. Triton sinks the conversion below the shared-memory load and,
  since `tl.dot` wants V's key dimension per thread and sm_90 has no transposing `ldmatrix` for 8-bit data, reads
  V from shared memory one byte per thread and instruction (128 `LDS.U8` per warp per 64-key tile in the SASS).
- 1: V converted right after its (16-byte) load by inline PTX (`cvt.rn.f16x2.e4m3x2`, which the compiler may not
  move: is_pure=False), then staged as float16 through shared memory for a 16-bit transposing `ldmatrix`; K as 0.
- 2: K and V both so (no byte-wide shared loads; the loop's SASS shrinks from 1,108 to 621 instructions per warp
  and tile under triton 3.6, but the float16 staging adds shared memory and a barrier per tile).
- 3: as 2, with bit moves instead of `cvt` (float16 holding value * 2^-8, undone in the scales).
- t (`decode_fp8_vt_variant`): V stored transposed within each cache block, `(num_blocks, kv_heads, head_dim,
  block_size)`, so that V's key axis is contiguous as the second product wants (the layout of vLLM's first paged
  attention kernel): V then needs no float16 staging through shared memory and converts like K. Products transposed
  as attend_tile's SWAP (keys on the MMA's 16-row side); one cache block per tile (BLOCK_N <= block_size), so
  the tile's block-table entry is one scalar load.
`PAIRS`: two tiles per loop iteration. Triton single-buffers each tile's async copy here (one shared-memory slot per
load whatever num_stages), so a program has one tile of loads in flight while it computes; two tiles per iteration
double the bytes in flight per program at the same occupancy.
Measured on the H200 (perf/RESULTS.md): 1 at (64 keys, 2 warps, 6 stages) and (32, 1, 8) is the fastest and became
the engine's fp8 tile (attend_tile's V_PTX); stages 5-6 (two buffers per load) beat 2-4 (one) and 8 (three).
"""

from __future__ import annotations

from nanovllm_ref.kernels._triton_common import LOG2E, num_sms, tl, triton
from nanovllm_ref.kernels.decode_attention import _decode_reduce_kernel, decode_num_splits, decode_workspace_numel

if triton is not None:
    from nanovllm_ref.kernels._triton_common import e4m3x4_to_f16

    @triton.jit
    def e4m3x4_to_f16_bits(x):
        """Four e4m3 values -> float16 holding value * 2^-8, by bit moves alone: the sign to bit 15, exponent and
        mantissa shifted one place into the float16 fields (e4m3 subnormals land on float16 subnormals, exact)."""
        return tl.inline_asm_elementwise(
            "{ .reg .b32 y, z; prmt.b32 y, $2, 0, 0x1404; shr.b32 z, y, 1; and.b32 z, z, 0x3F803F80;"
            " and.b32 y, y, 0x80008000; or.b32 $0, y, z;"
            " prmt.b32 y, $2, 0, 0x3424; shr.b32 z, y, 1; and.b32 z, z, 0x3F803F80;"
            " and.b32 y, y, 0x80008000; or.b32 $1, y, z; }",
            "=r,=r,r", [x], dtype=tl.float16, is_pure=False, pack=4)

    @triton.jit
    def _to_dot_dtype(x, UPCAST: tl.constexpr, CVT: tl.constexpr):
        if UPCAST:
            return x.to(tl.float32)
        elif CVT == 3:
            return e4m3x4_to_f16_bits(x)
        elif CVT >= 1:
            return e4m3x4_to_f16(x)
        else:
            return x.to(tl.float16)

    @triton.jit
    def _fp8_tile(
        acc, l_i, m_i,  # running state: (BLOCK_G, BLOCK_D) f32, (BLOCK_G,) f32, (BLOCK_G,) f32 (log2 domain)
        q,  # (BLOCK_G, BLOCK_D) in the products' dtype, zero in padded rows / columns
        k_base, v_base, bt_row, n0, end, qk_scale, stride_cb, stride_cs, stride_cd,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
        MASKED: tl.constexpr, UPCAST: tl.constexpr, CVT: tl.constexpr,
    ):
        offs_n = n0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        offs_d = tl.arange(0, BLOCK_D)
        n_mask = offs_n < end
        if MASKED:
            blk = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        else:
            blk = tl.load(bt_row + offs_n // BLOCK_SIZE).to(tl.int64)
        kv_off = (blk * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs)[:, None] + offs_d[None, :] * stride_cd
        if MASKED or BLOCK_D != HEAD_DIM:
            kv_mask = n_mask[:, None] & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_base + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(v_base + kv_off, mask=kv_mask, other=0.0)
        else:
            k = tl.load(k_base + kv_off)
            v = tl.load(v_base + kv_off)
        if CVT >= 2 or UPCAST:
            k = _to_dot_dtype(k, UPCAST, CVT)
        else:
            k = k.to(tl.float16)
        if CVT >= 1 or UPCAST:
            v = _to_dot_dtype(v, UPCAST, CVT)
        else:
            v = v.to(tl.float16)
        if UPCAST:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * qk_scale  # (BLOCK_G, BLOCK_N) f32, log2 domain
        if MASKED:
            s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every split's first tile has a visible key
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if UPCAST:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(tl.float16), v)
        return acc * alpha[:, None] + pv, l_i, m_new

    @triton.jit
    def decode_fp8_split_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
        kv_scale_ptr,  # (2, num_kv_heads) float32 K and V scales
        order_ptr, out_ptr, part_acc_ptr, part_ml_ptr,  # as decode_attention's _decode_split_kernel
        qk_scale,
        stride_qs, stride_qh, stride_qd,
        stride_os, stride_oh, stride_od,
        stride_cb, stride_cs, stride_ch, stride_cd,
        stride_bt,
        group, num_kv_heads, num_splits,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
        HEAD_DIM: tl.constexpr, DIRECT_OUT: tl.constexpr, UPCAST: tl.constexpr, HAS_ORDER: tl.constexpr,
        CVT: tl.constexpr, PAIRS: tl.constexpr = False,
    ):
        pid = tl.program_id(0)  # split fastest, then KV head, then sequence (see _decode_split_kernel)
        split = pid % num_splits
        kvh = (pid // num_splits) % num_kv_heads
        seq = pid // (num_splits * num_kv_heads)
        if HAS_ORDER:
            seq = tl.load(order_ptr + seq).to(tl.int32)
        seq_len = tl.load(seq_lens_ptr + seq)
        qk_scale = qk_scale * tl.load(kv_scale_ptr + kvh)
        v_scale = tl.load(kv_scale_ptr + num_kv_heads + kvh)
        if CVT == 3 and not UPCAST:  # the bit conversion yields value * 2^-8 (exactly): undo it in the scales
            qk_scale = qk_scale * 256.0
            v_scale = v_scale * 256.0
        chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * chunk
        end = tl.minimum(start + chunk, seq_len)
        full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N

        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        heads = kvh * group + offs_g
        mask = (offs_g < group)[:, None] & (offs_d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                    mask=mask, other=0.0)
        q = q.to(tl.float32) if UPCAST else q.to(tl.float16)  # exact for bf16 queries within fp16's range
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        k_base = k_cache_ptr + kvh * stride_ch
        v_base = v_cache_ptr + kvh * stride_ch
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        pair_end = start + (full_end - start) // (2 * BLOCK_N) * (2 * BLOCK_N)
        if PAIRS:  # two tiles per iteration: both tiles' loads in flight together (twice the bytes per program)
            for n0 in range(start, pair_end, 2 * BLOCK_N):
                acc, l_i, m_i = _fp8_tile(acc, l_i, m_i, q, k_base, v_base, bt_row, n0, end, qk_scale, stride_cb,
                                          stride_cs, stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, False, UPCAST,
                                          CVT)
                acc, l_i, m_i = _fp8_tile(acc, l_i, m_i, q, k_base, v_base, bt_row, n0 + BLOCK_N, end, qk_scale,
                                          stride_cb, stride_cs, stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM,
                                          False, UPCAST, CVT)
        else:
            pair_end = start
        for n0 in range(pair_end, full_end, BLOCK_N):
            acc, l_i, m_i = _fp8_tile(acc, l_i, m_i, q, k_base, v_base, bt_row, n0, end, qk_scale, stride_cb,
                                      stride_cs, stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, False, UPCAST, CVT)
        if full_end < end:  # the split's last, partial tile
            acc, l_i, m_i = _fp8_tile(acc, l_i, m_i, q, k_base, v_base, bt_row, full_end, end, qk_scale, stride_cb,
                                      stride_cs, stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, True, UPCAST, CVT)
        acc = acc * v_scale
        if DIRECT_OUT:  # seq_len 0 (a padded batch slot): l = 0, acc = 0 -> output 0
            o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            o_off = seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
            tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=mask)
        else:  # an empty split: m = -inf, l = 0, acc = 0; the reduce weighs it 0
            row = (seq.to(tl.int64) * (group * num_kv_heads) + heads) * num_splits + split  # (BLOCK_G,)
            tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=mask)
            tl.store(part_ml_ptr + row * 2, m_i, mask=offs_g < group)
            tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=offs_g < group)


if triton is not None:

    @triton.jit
    def _vt_tile(
        acc, l_i, m_i,  # transposed running state: (BLOCK_D, BLOCK_G) f32, (BLOCK_G,) f32, (BLOCK_G,) f32
        qt,  # (BLOCK_D, BLOCK_G) float16, zero in padded columns
        k_base, vt_base, bt_row, n0, end, qk_scale, stride_cb, stride_cs, stride_vb, stride_vd,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
    ):
        blk = tl.load(bt_row + n0 // BLOCK_SIZE).to(tl.int64)  # the tile's one cache block
        rows = tl.multiple_of(n0 % BLOCK_SIZE, BLOCK_N) + tl.arange(0, BLOCK_N)  # (BLOCK_N,) rows in the block
        offs_d = tl.arange(0, BLOCK_D)
        k_off = blk * stride_cb + rows[:, None] * stride_cs + offs_d[None, :]  # (BLOCK_N, BLOCK_D)
        vt_off = blk * stride_vb + offs_d[:, None] * stride_vd + rows[None, :]  # (BLOCK_D, BLOCK_N), keys contiguous
        if MASKED:
            n_mask = n0 + tl.arange(0, BLOCK_N) < end
            k = tl.load(k_base + k_off, mask=n_mask[:, None], other=0.0)
            vt = tl.load(vt_base + vt_off, mask=n_mask[None, :], other=0.0)
        else:
            k = tl.load(k_base + k_off)
            vt = tl.load(vt_base + vt_off)
        st = tl.dot(k.to(tl.float16), qt) * qk_scale  # (BLOCK_N, BLOCK_G) f32, log2 domain
        if MASKED:
            st = tl.where(n_mask[:, None], st, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(st, 0))
        alpha = tl.exp2(m_i - m_new)
        pt = tl.exp2(st - m_new[None, :])
        l_i = l_i * alpha + tl.sum(pt, 0)
        return acc * alpha[None, :] + tl.dot(vt.to(tl.float16), pt.to(tl.float16)), l_i, m_new

    @triton.jit
    def decode_fp8_vt_split_kernel(
        q_ptr, k_cache_ptr, vt_cache_ptr, block_tables_ptr, seq_lens_ptr, kv_scale_ptr, order_ptr, out_ptr,
        part_acc_ptr, part_ml_ptr, qk_scale,
        stride_qs, stride_qh, stride_os, stride_oh,
        stride_cb, stride_cs, stride_ch,  # K cache (num_blocks, block_size, kv_heads, head_dim), unit last stride
        stride_vb, stride_vh, stride_vd,  # V cache (num_blocks, kv_heads, head_dim, block_size), unit last stride
        stride_bt, group, num_kv_heads, num_splits,
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
        DIRECT_OUT: tl.constexpr, HAS_ORDER: tl.constexpr,
    ):
        pid = tl.program_id(0)  # split fastest, then KV head, then sequence (see _decode_split_kernel)
        split = pid % num_splits
        kvh = (pid // num_splits) % num_kv_heads
        seq = pid // (num_splits * num_kv_heads)
        if HAS_ORDER:
            seq = tl.load(order_ptr + seq).to(tl.int32)
        seq_len = tl.load(seq_lens_ptr + seq)
        qk_scale = qk_scale * tl.load(kv_scale_ptr + kvh)
        chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        start = split * chunk
        end = tl.minimum(start + chunk, seq_len)
        full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
        offs_g, offs_d = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D)
        heads = kvh * group + offs_g
        mask_t = (offs_d < BLOCK_D)[:, None] & (offs_g < group)[None, :]  # (BLOCK_D, BLOCK_G)
        qt = tl.load(q_ptr + seq.to(tl.int64) * stride_qs + heads[None, :] * stride_qh + offs_d[:, None],
                     mask=mask_t, other=0.0).to(tl.float16)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_D, BLOCK_G], tl.float32)
        k_base = k_cache_ptr + kvh * stride_ch
        vt_base = vt_cache_ptr + kvh * stride_vh
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for n0 in range(start, full_end, BLOCK_N):
            acc, l_i, m_i = _vt_tile(acc, l_i, m_i, qt, k_base, vt_base, bt_row, n0, end, qk_scale, stride_cb,
                                     stride_cs, stride_vb, stride_vd, BLOCK_SIZE, BLOCK_N, BLOCK_D, False)
        if full_end < end:
            acc, l_i, m_i = _vt_tile(acc, l_i, m_i, qt, k_base, vt_base, bt_row, full_end, end, qk_scale, stride_cb,
                                     stride_cs, stride_vb, stride_vd, BLOCK_SIZE, BLOCK_N, BLOCK_D, True)
        acc = acc * tl.load(kv_scale_ptr + num_kv_heads + kvh)
        if DIRECT_OUT:
            o = acc / tl.where(l_i > 0, l_i, 1.0)[None, :]
            o_off = seq.to(tl.int64) * stride_os + heads[None, :] * stride_oh + offs_d[:, None]
            tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=mask_t)
        else:
            row = (seq.to(tl.int64) * (group * num_kv_heads) + heads) * num_splits + split  # (BLOCK_G,)
            tl.store(part_acc_ptr + row[None, :] * BLOCK_D + offs_d[:, None], acc, mask=mask_t)
            tl.store(part_ml_ptr + row * 2, m_i, mask=offs_g < group)
            tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=offs_g < group)


def transpose_v_blocks(v_cache):
    """(num_blocks, block_size, kv_heads, head_dim) -> (num_blocks, kv_heads, head_dim, block_size), contiguous."""
    return v_cache.permute(0, 2, 3, 1).contiguous()


def _split_buffers(q, k_cache, tile, num_splits, max_seq_len, split_batch):
    """What both variant launchers share, as decode_attention sets it up: the tile's other launch options, BLOCK_N,
    the split count, the output and the split-K partials (acc, (max, sum))."""
    import torch

    num_seqs, num_heads, head_dim = q.shape
    cfg = dict(tile)
    block_n = cfg.pop("BLOCK_N")
    if num_splits is None:
        num_splits = decode_num_splits(split_batch or num_seqs, k_cache.shape[2], max_seq_len, block_n,
                                       num_sms(q.device))
    numel = decode_workspace_numel(num_seqs, num_heads, head_dim, num_splits)
    ws = torch.empty(numel if num_splits > 1 else 1, dtype=torch.float32, device=q.device)
    acc_numel = num_seqs * num_heads * num_splits * head_dim
    return cfg, block_n, num_splits, torch.empty_like(q), ws[:acc_numel], ws[acc_numel:]


def _reduce_splits(out, part_acc, part_ml, num_splits):
    """Merge the split-K partials into `out` (nothing to do for one split)."""
    if num_splits > 1:
        num_seqs, num_heads, head_dim = out.shape
        block_d = max(16, triton.next_power_of_2(head_dim))
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_acc, part_ml, out, *out.stride(), num_splits, BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d, HEAD_DIM=head_dim, num_warps=2)
    return out


def decode_fp8_vt_variant(q, k_cache, vt_cache, block_tables, seq_lens, scale, kv_scales, *, order, tile,
                          num_splits=None, max_seq_len=4096, split_batch=None):
    """Launch `decode_fp8_vt_split_kernel` (V from `transpose_v_blocks`) as `decode_fp8_variant` launches its kernel;
    tile: BLOCK_N (<= the cache's block size), num_warps, num_stages. Head_dim a power of two, unit strides."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if tile["BLOCK_N"] > block_size:
        raise ValueError(f"BLOCK_N {tile['BLOCK_N']} > block size {block_size}")
    cfg, block_n, num_splits, out, part_acc, part_ml = _split_buffers(q, k_cache, tile, num_splits, max_seq_len,
                                                                      split_batch)
    group = num_heads // num_kv_heads
    decode_fp8_vt_split_kernel[(num_seqs * num_kv_heads * num_splits,)](
        q, k_cache, vt_cache, block_tables, seq_lens, kv_scales, order, out, part_acc, part_ml, scale * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), vt_cache.stride(0), vt_cache.stride(1), vt_cache.stride(2), block_tables.stride(0),
        group, num_kv_heads, num_splits, BLOCK_SIZE=block_size, BLOCK_N=block_n,
        BLOCK_G=max(8, triton.next_power_of_2(group)), BLOCK_D=head_dim, DIRECT_OUT=num_splits == 1, HAS_ORDER=True,
        **cfg)
    return _reduce_splits(out, part_acc, part_ml, num_splits)


def decode_fp8_variant(q, k_cache, v_cache, block_tables, seq_lens, scale, kv_scales, *, order, tile,
                       num_splits=None, max_seq_len=4096, split_batch=None):
    """Launch `decode_fp8_split_kernel` as kernels/decode_attention.decode_attention launches its kernel; tile:
    BLOCK_N, num_warps, num_stages, CVT."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    cfg, block_n, num_splits, out, part_acc, part_ml = _split_buffers(q, k_cache, tile, num_splits, max_seq_len,
                                                                      split_batch)
    group = num_heads // num_kv_heads
    decode_fp8_split_kernel[(num_seqs * num_kv_heads * num_splits,)](
        q, k_cache, v_cache, block_tables, seq_lens, kv_scales, order, out, part_acc, part_ml, scale * LOG2E,
        *q.stride(), *out.stride(), *k_cache.stride(), block_tables.stride(0), group, num_kv_heads, num_splits,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), HEAD_DIM=head_dim, DIRECT_OUT=num_splits == 1,
        UPCAST=False, HAS_ORDER=True, **cfg)
    return _reduce_splits(out, part_acc, part_ml, num_splits)
