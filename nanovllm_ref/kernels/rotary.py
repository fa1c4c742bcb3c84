"""Rotary position embedding, "rotate half" (GPT-NeoX) layout, as transformers' Llama/Qwen apply it.

cos/sin are made in float32 and cast to the activation dtype before the products, as transformers does,
so bfloat16 runs round the same way.

On CUDA the Triton backends rotate q and k inside the QKV epilogue kernel (kernels/qkv_epilogue.py), at these
rounding points; the torch and sdpa backends run this reference on any device (models/qwen3.py).
"""

from __future__ import annotations

import torch


def rope_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int) -> torch.Tensor:
    """(max_positions, head_dim) float32 table: cos in the first half of the columns, sin in the second."""
    t = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = t[:, None] * inv_freq.float()[None, :]  # (max_positions, head_dim // 2)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


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
