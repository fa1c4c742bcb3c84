"""Pieces shared by the Triton attention kernels (decode and prefill): the online-softmax tile update.

The update is FlashAttention-2's (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning", 2023, Algorithm 1): keep a running row max `m`, a running denominator `l` and an unnormalized
accumulator `acc`; for each tile of keys rescale the old state by `exp(m_old - m_new)`. As in the Triton
fused-attention tutorial, scores are scaled by `scale * log2(e)` so the exponentials are `exp2` (one MUFU op),
and the probabilities are cast to the K/V dtype before the second matmul (the standard FA precision trade).

SWAP (decode, a few query rows): the products are computed transposed, `S^T = K Q^T` and `O^T = V^T P^T`, so that
the keys fill the MMA's 16-row side and the queries its 8-wide one (`mma.m16n8k16`): a 2-head GQA group pads to 8
columns instead of 16 rows, which halves the MMAs, the accumulator's registers and the query's (the swap-AB trick
of small-batch GEMMs, e.g. TensorRT-LLM's).

K/V are read straight from the paged cache: key position `pos` of a sequence lives at block
`block_table[pos // BLOCK_SIZE]`, row `pos % BLOCK_SIZE`. The gather is per key row, so a tile of BLOCK_N keys
may span several cache blocks (block_size 16) or a fraction of one (block_size 256): the tile size is chosen
for the hardware, independently of the page size (as vLLM's Triton unified attention does).
"""

from __future__ import annotations

import torch

from ..env import hopper, native_e4m3, num_sms, upcast_dots  # noqa: F401 (the kernels' device probes)

try:  # optional (the "gpu" extra): without it the torch references still import
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = tl = None

LOG2E = 1.4426950408889634


def f16_dots(q: torch.Tensor, kv_scales: torch.Tensor | None) -> bool:
    """An fp8 cache read by bfloat16 queries on a GPU: both products in float16 (kernels/decode_attention.py)."""
    return kv_scales is not None and q.dtype == torch.bfloat16 and not upcast_dots(q.device)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs: exact fp32 products ("ieee"), since tf32 (10-bit mantissa) would miss the fp32 tolerance.
    16-bit inputs: the option is ignored; pass the default."""
    return "ieee" if dtype == torch.float32 else "tf32"


if triton is not None:

    @triton.jit
    def to_e4m3(x, EXACT: tl.constexpr):
        """float32 -> float8e4nv by kernels/kv_quant.py's rule: saturate to +-448, round to nearest even. EXACT (the
        interpreter, whose conversion drops the carry of a round-up into the exponent and truncates subnormals):
        round in float32 arithmetic first, so that the conversion only meets representable values."""
        x = tl.minimum(tl.maximum(x, -448.0), 448.0)
        if EXACT:
            bits = x.to(tl.int32, bitcast=True)
            # the biased exponent of e4m3's spacing at |x|: 3 mantissa bits; 2^-9 from the subnormals down
            e = tl.maximum(((bits >> 23) & 0xFF) - 3, 118)
            step = (e << 23).to(tl.float32, bitcast=True)
            y = (tl.abs(x) / step + 8388608.0) - 8388608.0  # exact division by a power of two, then RNE (< 2^23)
            x = tl.where(x < 0, -y, y) * step
        return x.to(tl.float8e4nv)

    @triton.jit
    def e4m3x4_to_f16(x):
        """Four e4m3 values (one 32-bit register) -> four float16, two `cvt.rn.f16x2.e4m3x2` (sm_89+, `native_e4m3`);
        exact: every e4m3 value is a float16. The fp8 decode tile's V (attend_tile's V_PTX): a plain `.to(float16)`
        lets Triton sink the conversion below the shared-memory staging, and since `tl.dot` wants V's key dimension
        per thread and sm_90 has no transposing `ldmatrix` for 8-bit data, V is then read from shared memory one
        byte per instruction (128 `LDS.U8` per warp and 64-key tile). Converted right after its global load, V is
        staged as float16 and read by a 16-bit transposing `ldmatrix`. Impure, so the compiler keeps it where it
        is written. K needs none of this: its products want head_dim per thread, the cache's contiguous axis."""
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [x], dtype=tl.float16, is_pure=False, pack=4)

    @triton.jit
    def attend_tile(
        acc, l_i, m_i,  # running state: (BLOCK_M, BLOCK_D) f32, (BLOCK_M,) f32, (BLOCK_M,) f32 (log2 domain)
        q,  # (BLOCK_M, BLOCK_D), zero in padded rows/columns
        k_cache_ptr, v_cache_ptr,  # already offset to this KV head
        bt_row_ptr,  # this sequence's block-table row
        n0,  # first key position of the tile
        load_end,  # keys at positions >= load_end are not loaded (only used when MASKED)
        row_end,  # (BLOCK_M,) key pos is visible to row r iff pos < row_end[r] (only used when MASKED)
        qk_scale,  # softmax scale * log2(e)
        stride_cb, stride_cs, stride_cd,  # cache strides: block, row in block, dim
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
        MASKED: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
        V_PTX: tl.constexpr,  # an fp8 V converted to float16 by e4m3x4_to_f16 (q float16), else by .to(q.dtype)
        SWAP: tl.constexpr = False,  # both products transposed: keys are the MMA's rows, q's the columns (decode)
    ):
        offs_n = n0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        offs_d = tl.arange(0, BLOCK_D)
        # Unmasked tiles (the bulk of a long context) load without predicates so loads stay vectorized.
        if MASKED:
            n_mask = offs_n < load_end
            blk = tl.load(bt_row_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        else:
            blk = tl.load(bt_row_ptr + offs_n // BLOCK_SIZE).to(tl.int64)
        row_off = blk * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs  # (BLOCK_N,)
        kv_off = row_off[:, None] + offs_d[None, :] * stride_cd  # (BLOCK_N, BLOCK_D)
        if MASKED:
            kv_mask = n_mask[:, None] & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        elif BLOCK_D != HEAD_DIM:
            d_mask = (offs_d < HEAD_DIM)[None, :]
            k = tl.load(k_cache_ptr + kv_off, mask=d_mask, other=0.0)
            v = tl.load(v_cache_ptr + kv_off, mask=d_mask, other=0.0)
        else:
            k = tl.load(k_cache_ptr + kv_off)
            v = tl.load(v_cache_ptr + kv_off)
        k, v = k.to(q.dtype), e4m3x4_to_f16(v) if V_PTX else v.to(q.dtype)

        # (the two products are written out rather than in a helper: nested jit calls are slow to interpret)
        if UPCAST:  # interpreter: see upcast_dots
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        elif SWAP:  # (K q^T)^T: a register relayout, no data moved (see the docstring)
            s = tl.trans(tl.dot(k, tl.trans(q), input_precision=PREC))
        else:
            s = tl.dot(q, tl.trans(k), input_precision=PREC)
        s = s * qk_scale  # (BLOCK_M, BLOCK_N) f32, log2 domain
        # Every row sees at least one key in the first tile it processes (callers guarantee it), so m_new is
        # finite from then on and no exp2(-inf - -inf) NaN can appear.
        if MASKED:
            visible = offs_n[None, :] < row_end[:, None]
            s_max = tl.where(visible, s, float("-inf"))
        else:
            s_max = s
        m_new = tl.maximum(m_i, tl.max(s_max, 1))
        alpha = tl.exp2(m_i - m_new)  # rescales the old state; 0 on the first tile (m_i = -inf)
        # exp2 of the very expression the unmasked tile computes (the compiler fuses `s * qk_scale - m` into one
        # FMA), the mask applied after it: a key's weight has the same bits whether its tile is masked for the
        # query's chunk or not, which the batch-invariant mode needs (a masked `s` before the subtraction stops
        # the fusion, and the masked tile's weights then differ from the unmasked one's in the last bit)
        p = tl.exp2(s - m_new[:, None])
        if MASKED:
            p = tl.where(visible, p, 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(v.dtype)  # P in the K/V dtype for the second product, as FlashAttention does
        if UPCAST:
            pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        elif SWAP:
            pv = tl.trans(tl.dot(tl.trans(v), tl.trans(p), input_precision=PREC))
        else:
            pv = tl.dot(p, v, input_precision=PREC)
        acc = acc * alpha[:, None] + pv
        return acc, l_i, m_new
