"""The QKV projection's epilogue in one kernel: per-head q/k RMSNorm (Qwen3), RoPE, and the KV store.

Unfused, a layer runs up to six launches between the QKV matmul and attention (q norm, a copy of the strided k
for its norm, k norm, RoPE on q, RoPE on k, the KV store), each a pass over a few KiB per token: at decode
batch sizes they cost launch gaps, not bytes. Here one program per token reads its packed `[q | k | v]` row of
the matmul output once, normalizes and rotates q and k in registers, writes q for attention and k, v into the
paged cache (slot -1 = padding, not stored). vLLM fuses the same steps (`fused_qk_norm_rope`, and the KV store
in its attention backends' `reshape_and_cache`).

Arithmetic follows the unfused references' rounding points exactly (kernels/rmsnorm.py, kernels/rotary.py):
the norm in float32 cast to the model dtype, times the weight rounded to the model dtype; RoPE's cos/sin cast
to the model dtype and each product and the sum rounded to it. So the fused path equals the unfused one up to
the float32 reduction order of the norm. An fp8 cache (kv_scales given) gets k and v quantized in registers by
kernels/kv_quant.py's rule (as kernels/store_kv.py does).
"""

from __future__ import annotations

import torch

from ._triton_common import tl, triton
from .rmsnorm import rms_norm_reference
from .rotary import rotary_tables, rotate
from .store_kv import store_kv_reference

# bytes of q/k rows the reference norms and rotates at once: its temporaries stay in a core's L2 cache (a prompt
# step's 5,141 x 10 x 32 float32 rows: 7-10 ms a layer in blocks of 256 KB against 14-17 ms in one pass)
CPU_BLOCK_BYTES = 256 * 1024


def qk_norm_weight(q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, num_heads: int,
                   num_kv_heads: int) -> torch.Tensor | None:
    """(num_heads + num_kv_heads, head_dim): q's norm weight for each query head, then k's for each KV head, so that
    one norm serves queries and keys side by side (None: no q/k norm)."""
    if q_weight is None:
        return None
    d = q_weight.shape[-1]
    return torch.cat([q_weight.expand(num_heads, d), k_weight.expand(num_kv_heads, d)])


def qkv_norm_rope_reference(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, qk_weight: torch.Tensor | None, eps: float,
    num_heads: int, num_kv_heads: int, head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k (normed by `qk_weight`, see qk_norm_weight, and rotated by the factors of kernels/rotary.rotary_tables)
    and v of the packed QKV rows, each (num_tokens, heads, head_dim). Queries and keys side by side: half the small
    ops of one each; every row is normed and rotated on its own, ~8 full passes over the rows, memory bound, so a
    prompt step runs them a cache-sized block of tokens at a time."""
    heads, qk_heads = qkv.reshape(qkv.shape[0], -1, head_dim), num_heads + num_kv_heads  # (tokens, all heads, d)
    qk = heads[:, :qk_heads]
    rows = max(1, CPU_BLOCK_BYTES // (qk.shape[1] * qk.shape[2] * qk.element_size()))
    if qk.shape[0] <= rows:  # one block (a decode step): no slices
        out = rotate(rms_norm_reference(qk, qk_weight, eps) if qk_weight is not None else qk, cos, sin)
    else:
        out = qk.new_empty(qk.shape)
        for a in range(0, qk.shape[0], rows):
            x = qk[a : a + rows]
            if qk_weight is not None:
                x = rms_norm_reference(x, qk_weight, eps)
            rotate(x, cos[a : a + rows], sin[a : a + rows], out=out[a : a + rows])
    q, k = out.split([num_heads, num_kv_heads], dim=1)
    return q, k, heads[:, qk_heads:]


def qkv_epilogue_reference(
    qkv: torch.Tensor,  # (num_tokens, (num_heads + 2 * num_kv_heads) * head_dim): the packed QKV output
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin_cache: torch.Tensor,  # (max_positions, head_dim) float32: [cos | sin]
    q_weight: torch.Tensor | None,  # (head_dim,) q RMSNorm weight, or None (no q/k norm)
    k_weight: torch.Tensor | None,
    eps: float,
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (num_tokens,) int, -1 = not stored
    num_heads: int,
    num_kv_heads: int,
    kv_scales: torch.Tensor | None = None,  # (2, num_kv_heads) float32: an fp8 cache's K and V scales
) -> torch.Tensor:  # q: (num_tokens, num_heads, head_dim)
    """The unfused epilogue: qkv_norm_rope_reference, then the reference KV store (the CPU backends run the same
    steps with their own store: attention/base.py)."""
    cos, sin = rotary_tables(positions, cos_sin_cache, qkv.dtype)
    weight = qk_norm_weight(q_weight, k_weight, num_heads, num_kv_heads)
    q, k, v = qkv_norm_rope_reference(qkv, cos, sin, weight, eps, num_heads, num_kv_heads, k_cache.shape[-1])
    store_kv_reference(k, v, k_cache, v_cache, slot_mapping, kv_scales)
    return q


if triton is not None:
    from ._triton_common import to_e4m3, upcast_dots

    @triton.jit
    def _norm_rope(x1, x2, w_ptr, cos, sin, eps, offs_d, d_mask, HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr,
                   dt: tl.constexpr):
        """(BLOCK_H, HALF) halves of each head (float32) -> rotated halves, rounded as the references."""
        if HAS_NORM:
            var = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / HEAD_DIM  # (BLOCK_H,)
            r = tl.rsqrt(var + eps)[:, None]
            w1 = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            w2 = tl.load(w_ptr + HEAD_DIM // 2 + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
            x1 = (w1 * (x1 * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            x2 = (w2 * (x2 * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        a1 = (x1 * cos).to(dt).to(tl.float32)
        b1 = (-x2 * sin).to(dt).to(tl.float32)
        a2 = (x2 * cos).to(dt).to(tl.float32)
        b2 = (x1 * sin).to(dt).to(tl.float32)
        return (a1 + b1).to(dt), (a2 + b2).to(dt)

    @triton.jit
    def _qkv_epilogue_kernel(
        qkv_ptr, pos_ptr, cs_ptr, qw_ptr, kw_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
        kv_scale_ptr,  # (2, num_kv_heads) float32 K and V scales (FP8 only)
        stride_t, stride_qt, stride_qh, stride_cs,
        stride_cb, stride_cr, stride_ch,  # cache strides (block, row, head); the last dim is contiguous
        num_heads, num_kv_heads, eps,
        HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
        BLOCK_HALF: tl.constexpr, HAS_NORM: tl.constexpr, FP8: tl.constexpr, EXACT_ROUND: tl.constexpr,
    ):
        tok = tl.program_id(0).to(tl.int64)
        HALF: tl.constexpr = HEAD_DIM // 2
        dt = q_out_ptr.dtype.element_ty
        pos = tl.load(pos_ptr + tok).to(tl.int64)
        offs_d = tl.arange(0, BLOCK_HALF)
        d_mask = offs_d < HALF
        cos = tl.load(cs_ptr + pos * stride_cs + offs_d, mask=d_mask, other=0.0).to(dt).to(tl.float32)[None, :]
        sin = tl.load(cs_ptr + pos * stride_cs + HALF + offs_d, mask=d_mask, other=0.0).to(dt).to(tl.float32)[None, :]
        row = qkv_ptr + tok * stride_t
        # q heads
        hq = tl.arange(0, BLOCK_HQ)[:, None]
        mq = (hq < num_heads) & d_mask[None, :]
        src = row + hq * HEAD_DIM + offs_d[None, :]
        q1, q2 = _norm_rope(tl.load(src, mask=mq, other=0.0).to(tl.float32),
                            tl.load(src + HALF, mask=mq, other=0.0).to(tl.float32),
                            qw_ptr, cos, sin, eps, offs_d, d_mask, HEAD_DIM, HAS_NORM, dt)
        dst = q_out_ptr + tok * stride_qt + hq * stride_qh + offs_d[None, :]
        tl.store(dst, q1, mask=mq)
        tl.store(dst + HALF, q2, mask=mq)
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot < 0:  # padding token: q is still written (attention reads it), K/V are not stored
            return
        # k heads (after the q heads), then v (after the k heads), into the cache row of `slot`
        hk = tl.arange(0, BLOCK_HK)[:, None]
        mk = (hk < num_kv_heads) & d_mask[None, :]
        src = row + (num_heads + hk) * HEAD_DIM + offs_d[None, :]
        k1, k2 = _norm_rope(tl.load(src, mask=mk, other=0.0).to(tl.float32),
                            tl.load(src + HALF, mask=mk, other=0.0).to(tl.float32),
                            kw_ptr, cos, sin, eps, offs_d, d_mask, HEAD_DIM, HAS_NORM, dt)
        cache_row = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cr
        cache_off = cache_row + hk * stride_ch + offs_d[None, :]
        src = src + num_kv_heads * HEAD_DIM
        v1, v2 = tl.load(src, mask=mk), tl.load(src + HALF, mask=mk)
        if FP8:  # (BLOCK_HK, 1) scales of the KV heads
            ks = tl.load(kv_scale_ptr + hk, mask=hk < num_kv_heads, other=1.0)
            vs = tl.load(kv_scale_ptr + num_kv_heads + hk, mask=hk < num_kv_heads, other=1.0)
            k1 = to_e4m3(tl.math.div_rn(k1.to(tl.float32), ks), EXACT_ROUND)
            k2 = to_e4m3(tl.math.div_rn(k2.to(tl.float32), ks), EXACT_ROUND)
            v1 = to_e4m3(tl.math.div_rn(v1.to(tl.float32), vs), EXACT_ROUND)
            v2 = to_e4m3(tl.math.div_rn(v2.to(tl.float32), vs), EXACT_ROUND)
        ct = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + cache_off, k1.to(ct), mask=mk)
        tl.store(k_cache_ptr + cache_off + HALF, k2.to(ct), mask=mk)
        tl.store(v_cache_ptr + cache_off, v1.to(ct), mask=mk)
        tl.store(v_cache_ptr + cache_off + HALF, v2.to(ct), mask=mk)


def qkv_epilogue(
    qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None, eps: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int, kv_scales: torch.Tensor | None = None,
) -> torch.Tensor:  # q: (num_tokens, num_heads, head_dim), qkv's dtype
    """Triton version of `qkv_epilogue_reference` (same arguments). CUDA-graph safe: no host sync."""
    n, d = qkv.shape[0], k_cache.shape[-1]
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * d and qkv.stride(1) == 1 and d % 2 == 0
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and k_cache.shape[2] == num_kv_heads
    assert cos_sin_cache.shape[-1] == d and cos_sin_cache.stride(-1) == 1 and slot_mapping.shape[0] == n
    q = torch.empty(n, num_heads, d, dtype=qkv.dtype, device=qkv.device)
    if n == 0:
        return q
    has_norm = q_weight is not None
    block_hq, block_half = triton.next_power_of_2(num_heads), triton.next_power_of_2(d // 2)
    _qkv_epilogue_kernel[(n,)](
        qkv, positions, cos_sin_cache, q_weight if has_norm else qkv, k_weight if has_norm else qkv, slot_mapping,
        q, k_cache, v_cache, slot_mapping if kv_scales is None else kv_scales,
        qkv.stride(0), q.stride(0), q.stride(1), cos_sin_cache.stride(0), *k_cache.stride()[:3],
        num_heads, num_kv_heads, eps,
        HEAD_DIM=d, BLOCK_SIZE=k_cache.shape[1], BLOCK_HQ=block_hq, BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=block_half, HAS_NORM=has_norm, FP8=kv_scales is not None, EXACT_ROUND=upcast_dots(qkv.device),
        num_warps=max(1, min(8, block_hq * block_half // 256)),
    )
    return q
