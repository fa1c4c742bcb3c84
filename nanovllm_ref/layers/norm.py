"""RMSNorm layer with the residual add fused in (Triton kernel on CUDA, the torch reference elsewhere)."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.rmsnorm import rms_norm, rms_norm_reference


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        norm = rms_norm if x.is_cuda else rms_norm_reference
        return norm(x, self.weight, self.eps, residual)
