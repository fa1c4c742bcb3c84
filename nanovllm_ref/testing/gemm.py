"""The batch-invariant GEMM's kernel cases (nanovllm_ref/kernels/matmul.py), registered in testing/kernels.py.

The kernel sums K in SPLIT_K splits of K_SPLIT (a multiple of BLOCK_K), the last one ending at K: it is shorter
whenever split * K_SPLIT > K. The engine's tuned layers (invariant_gemm.json) split K evenly, so the fixed inputs
add the engine's own split-4 layer (N, K) = (1024, 2048) and a candidate forced to split 3, whose last split is
short on both the draws and that layer: a split that runs past K reads the next row's weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import strategies as st

from ..kernels.matmul import invariant_linear_reference

SPLIT_3 = (16, 64, 64, 1, 4, 1, 3)  # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages, SPLIT_K)
ENGINE_SPLIT_LAYER = (1024, 2048)  # (N, K) of a tuned layer that splits K in 4


@st.composite
def linear_inputs(draw, size: str, dtypes, magnitude: float, device: str) -> tuple:
    dtype = draw(st.sampled_from(list(dtypes)))
    m = draw(st.integers(1, 20 if size == "small" else 300))
    n, k = draw(st.sampled_from([(48, 200), (96, 448), (64, 130)] if size == "small" else [(1024, 2048),
                                                                                           (4096, 1024)]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = (torch.randn(m, k, generator=gen) * magnitude).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    bias = (torch.randn(n, generator=gen).to(dtype).to(device)) if draw(st.booleans()) else None
    return x, w, bias


def engine_split_layer(device: str) -> tuple:
    gen = torch.Generator().manual_seed(23)
    n, k = ENGINE_SPLIT_LAYER
    return (torch.randn(5, k, generator=gen).to(device), (torch.randn(n, k, generator=gen) / k**0.5).to(device),
            torch.randn(n, generator=gen).to(device))


def candidates() -> list[tuple[str, Callable]]:
    """(label, function) of nanovllm_ref's batch-invariant GEMMs: the engine's, and one split 3 ways."""
    from ..kernels.matmul import invariant_linear

    def split_3(x, weight, bias=None):
        return invariant_linear(x, weight, bias, config=SPLIT_3)

    return [("triton", invariant_linear), ("triton-split-3", split_3)]


__all__ = ["ENGINE_SPLIT_LAYER", "candidates", "engine_split_layer", "invariant_linear_reference", "linear_inputs"]
