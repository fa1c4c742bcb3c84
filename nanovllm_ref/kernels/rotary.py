"""Rotary position embedding, "rotate half" (GPT-NeoX) layout, as transformers' Llama/Qwen apply it.

cos/sin are made in float32 and cast to the activation dtype before the products, as transformers does,
so bfloat16 runs round the same way.

Triton kernel (`apply_rotary`): one program per token rotates all its heads, `(BLOCK_H, head_dim // 2)`
halves at a time; cos/sin are read once per token and shared by the heads. Arithmetic follows the reference
rounding points: cos/sin cast to the activation dtype, each product and the sum rounded to it (done in
float32, where products and sums of two 16-bit values are exact before that rounding). In float32 the GPU may
fuse a product and the sum into an FMA, so float32 agrees to rounding, not bitwise.
"""

from __future__ import annotations

import torch

try:  # the reference must import on machines without triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None


def rope_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int, scaling: float = 1.0) -> torch.Tensor:
    """(max_positions, head_dim) float32 table: cos in the first half of the columns, sin in the second."""
    t = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = t[:, None] * inv_freq.float()[None, :]  # (max_positions, head_dim // 2)
    return torch.cat([freqs.cos() * scaling, freqs.sin() * scaling], dim=-1)


def rotary_tables(
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin_cache: torch.Tensor,  # (max_positions, head_dim) float32: [cos | sin], each head_dim // 2
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # (num_tokens, 1, head_dim) each: [cos | cos], [-sin | sin]
    """The per-token factors of `rotate`, in the activation dtype (a CPU step makes them once for all its layers)."""
    cos, sin = cos_sin_cache[positions.long(), None].to(dtype).chunk(2, dim=-1)  # (num_tokens, 1, head_dim // 2)
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2 | x1], with the sign moved onto the sin table: each
    product and the sum rounded to x's dtype as in transformers' form; the second product and the sum in place
    (two full-size temporaries instead of four; half-width strided products measured slower than the cat).
    `out`: where to write the result (x's shape and dtype), e.g. a slice of a larger tensor."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.mul(x, cos, out=out).add_(torch.cat([x2, x1], dim=-1).mul_(sin))


def apply_rotary_reference(
    x: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin_cache: torch.Tensor,  # (max_positions, head_dim) float32: [cos | sin], each head_dim // 2
) -> torch.Tensor:
    return rotate(x, *rotary_tables(positions, cos_sin_cache, x.dtype))


if triton is not None:

    @triton.jit
    def _rotary_kernel(
        x_ptr, pos_ptr, cs_ptr, out_ptr,
        stride_xt, stride_xh, stride_xd,
        stride_ot, stride_oh, stride_od,
        stride_cs,
        num_heads,
        HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ):
        tok = tl.program_id(0).to(tl.int64)
        pos = tl.load(pos_ptr + tok).to(tl.int64)
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_HALF)
        d_mask = offs_d < HALF
        mask = (offs_h[:, None] < num_heads) & d_mask[None, :]  # (BLOCK_H, BLOCK_HALF)
        dt = x_ptr.dtype.element_ty
        # cos/sin: float32 table, cast to the activation dtype first (as the reference), then computed in f32
        cos = tl.load(cs_ptr + pos * stride_cs + offs_d, mask=d_mask, other=0.0).to(dt).to(tl.float32)
        sin = tl.load(cs_ptr + pos * stride_cs + HALF + offs_d, mask=d_mask, other=0.0).to(dt).to(tl.float32)
        x_off = tok * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :] * stride_xd
        x1 = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)  # first half of each head
        x2 = tl.load(x_ptr + x_off + HALF * stride_xd, mask=mask, other=0.0).to(tl.float32)
        # reference: x * cos + cat(-x2, x1) * sin, each op rounded to the activation dtype
        a1 = (x1 * cos[None, :]).to(dt).to(tl.float32)
        b1 = (-x2 * sin[None, :]).to(dt).to(tl.float32)
        a2 = (x2 * cos[None, :]).to(dt).to(tl.float32)
        b2 = (x1 * sin[None, :]).to(dt).to(tl.float32)
        o_off = tok * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(out_ptr + o_off, (a1 + b1).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptr + o_off + HALF * stride_od, (a2 + b2).to(out_ptr.dtype.element_ty), mask=mask)


def apply_rotary(
    x: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin_cache: torch.Tensor,  # (max_positions, head_dim) float32: [cos | sin], each head_dim // 2
) -> torch.Tensor:  # (num_tokens, num_heads, head_dim), x's dtype, a new tensor
    """Triton version of `apply_rotary_reference`."""
    assert triton is not None, "apply_rotary needs triton; use apply_rotary_reference"
    num_tokens, num_heads, head_dim = x.shape
    assert head_dim % 2 == 0 and cos_sin_cache.shape[-1] == head_dim and cos_sin_cache.stride(-1) == 1
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    half = head_dim // 2
    block_h, block_half = triton.next_power_of_2(num_heads), triton.next_power_of_2(half)
    _rotary_kernel[(num_tokens,)](
        x, positions, cos_sin_cache, out,
        *x.stride(), *out.stride(), cos_sin_cache.stride(0),
        num_heads,
        HALF=half, BLOCK_H=block_h, BLOCK_HALF=block_half,
        num_warps=max(1, min(8, block_h * block_half // 256)),
    )
    return out
