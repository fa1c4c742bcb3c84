"""RMSNorm, optionally fused with the residual add that precedes it (transformers' arithmetic order).

transformers computes `residual = x + residual` in the model dtype, normalizes in float32, casts back to
the model dtype, then multiplies by the weight in the model dtype; the reference does exactly that.
"""

from __future__ import annotations

import torch


def rms_norm_reference(
    x: torch.Tensor,  # (num_tokens, hidden)
    weight: torch.Tensor,  # (hidden,)
    eps: float,
    residual: torch.Tensor | None = None,  # (num_tokens, hidden)
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = weight * h.to(x.dtype)
    return out if residual is None else (out, residual)
