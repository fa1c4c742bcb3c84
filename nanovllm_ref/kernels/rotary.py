"""Rotary position embedding, "rotate half" (GPT-NeoX) layout, as transformers' Llama/Qwen apply it.

cos/sin are made in float32 and cast to the activation dtype before the products, as transformers does,
so bfloat16 runs round the same way.
"""

from __future__ import annotations

import torch


def rope_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int, scaling: float = 1.0) -> torch.Tensor:
    """(max_positions, head_dim) float32 table: cos in the first half of the columns, sin in the second."""
    t = torch.arange(max_positions, dtype=torch.float32, device=inv_freq.device)
    freqs = t[:, None] * inv_freq.float()[None, :]  # (max_positions, head_dim // 2)
    return torch.cat([freqs.cos() * scaling, freqs.sin() * scaling], dim=-1)


def apply_rotary_reference(
    x: torch.Tensor,  # (num_tokens, num_heads, head_dim)
    positions: torch.Tensor,  # (num_tokens,) int
    cos_sin_cache: torch.Tensor,  # (max_positions, head_dim) float32: [cos | sin], each head_dim // 2
) -> torch.Tensor:
    cos, sin = cos_sin_cache[positions.long()].to(x.dtype).chunk(2, dim=-1)  # (num_tokens, head_dim // 2)
    cos = torch.cat([cos, cos], dim=-1)[:, None, :]
    sin = torch.cat([sin, sin], dim=-1)[:, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin
