"""The decode kernel's key tile over an FP8 (e4m3) cache with float16 products, on GPUs with native e4m3 conversion.

Same online-softmax update as _triton_common.attend_tile (FlashAttention-2), specialised for where an fp8 cache's
decode time goes (perf/RESULTS.md, "Kernels"; variants in perf/fp8_decode_variants.py):
- V is converted right after its 16-byte global load by inline PTX (`cvt.rn.f16x2.e4m3x2`, two values per
  instruction, exact: every e4m3 value is a float16). A plain `.to(float16)` lets Triton sink the conversion below
  the shared-memory staging; since `tl.dot` wants V's key dimension per thread and sm_90 has no transposing
  `ldmatrix` for 8-bit data, V is then read from shared memory one byte per instruction (128 `LDS.U8` per warp
  and 64-key tile). Converted first, V is staged as float16 and read by a 16-bit transposing `ldmatrix`. The asm is
  marked impure so that the compiler keeps it where it is written.
- K stays `.to(float16)`: its products want head_dim per thread, the cache's contiguous axis, so its 8-bit
  shared-memory reads are already wide.
- K and V scales are not applied here: the caller folds the K scale into `qk_scale` and the V scale into the output.
`cvt ... e4m3x2` needs sm_89 or newer (`native_e4m3`); elsewhere the caller keeps attend_tile.
"""

from __future__ import annotations

import functools

import torch

from ._triton_common import tl, triton


@functools.cache
def native_e4m3(device: torch.device) -> bool:
    """True on a CUDA GPU whose PTX has `cvt.rn.f16x2.e4m3x2` (compute capability 8.9+: Ada, Hopper and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


if triton is not None:

    @triton.jit
    def e4m3x4_to_f16(x):
        """Four e4m3 values (one 32-bit register) -> four float16, two `cvt` instructions; exact."""
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [x], dtype=tl.float16, is_pure=False, pack=4)

    @triton.jit
    def attend_fp8_tile(
        acc, l_i, m_i,  # running state: (BLOCK_G, BLOCK_D) f32, (BLOCK_G,) f32, (BLOCK_G,) f32 (log2 domain)
        q,  # (BLOCK_G, BLOCK_D) float16, zero in padded rows / columns
        k_base, v_base,  # fp8 caches, already offset to this KV head
        bt_row,  # this sequence's block-table row
        n0, end,  # first key position of the tile; keys at positions >= end are not visible
        qk_scale,  # softmax scale * log2(e) * the K scale
        stride_cb, stride_cs, stride_cd,  # cache strides: block, row in block, dim
        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
        MASKED: tl.constexpr,  # the split's last, partial tile
    ):
        offs_n = n0 + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        offs_d = tl.arange(0, BLOCK_D)
        n_mask = offs_n < end
        if MASKED:
            blk = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        else:
            blk = tl.load(bt_row + offs_n // BLOCK_SIZE).to(tl.int64)
        kv_off = (blk * stride_cb + (offs_n % BLOCK_SIZE) * stride_cs)[:, None] + offs_d[None, :] * stride_cd
        if MASKED or BLOCK_D != HEAD_DIM:  # full tiles of a power-of-two head_dim load without predicates
            kv_mask = n_mask[:, None] & (offs_d[None, :] < HEAD_DIM)
            k = tl.load(k_base + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(v_base + kv_off, mask=kv_mask, other=0.0)
        else:
            k = tl.load(k_base + kv_off)
            v = tl.load(v_base + kv_off)
        v = e4m3x4_to_f16(v)  # (BLOCK_N, BLOCK_D) float16
        s = tl.dot(q, tl.trans(k.to(tl.float16))) * qk_scale  # (BLOCK_G, BLOCK_N) f32, log2 domain
        if MASKED:
            s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every split's first tile has a visible key
        alpha = tl.exp2(m_i - m_new)  # 0 on the first tile (m_i = -inf)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        return acc * alpha[:, None] + tl.dot(p.to(tl.float16), v), l_i, m_new
