"""RMSNorm layer with the residual add fused in (the Triton kernel where the plan uses kernels, CUDA; the torch
reference elsewhere)."""

from __future__ import annotations

import torch
from torch import nn

from ..config import REFERENCE_PLAN, Plan
from ..kernels.rmsnorm import rms_norm, rms_norm_reference


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float, plan: Plan = REFERENCE_PLAN) -> None:
        super().__init__()
        self.eps = eps
        self.norm = rms_norm if plan.use_kernels else rms_norm_reference
        self.weight = nn.Parameter(torch.ones(hidden), requires_grad=False)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.norm(x, self.weight, self.eps, residual)
