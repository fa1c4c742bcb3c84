"""SiLU-and-multiply of the merged gate/up projection (SwiGLU, as Llama/Qwen MLPs use it)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.activation import silu_and_mul


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (n, 2 * d) -> (n, d)
        if x.is_cuda:
            return silu_and_mul(x)
        # the reference's `silu(gate) * up` (the same roundings) with the product in place: a prompt step's
        # (tokens, d) temporary less, whose fresh pages cost more than the product itself on the CPU
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)
