"""SiLU-and-multiply of the merged gate/up projection (SwiGLU, as Llama/Qwen MLPs use it)."""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.activation import silu_and_mul, silu_and_mul_reference


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (n, 2 * d) -> (n, d)
        return silu_and_mul(x) if x.is_cuda else silu_and_mul_reference(x)
