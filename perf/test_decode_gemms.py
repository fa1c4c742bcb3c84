"""perf/decode_gemms.py's split-K GEMM and its reducing norm against torch, in Triton's interpreter off-GPU; the
decode GEMM shapes it times."""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref.testing.bench.models import ModelShape
from nanovllm_ref.testing.mismatch import triton_unavailable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_gemm_shapes_are_the_layers_projections():
    from perf.decode_gemms import gemms

    assert gemms(ModelShape.from_arch("qwen3-0.6b")) == {
        "qkv": (4096, 1024, False), "o": (1024, 2048, True), "gate_up": (6144, 1024, False),
        "down": (1024, 3072, True)}


@pytest.mark.skipif(triton_unavailable() is not None, reason=str(triton_unavailable()))
@pytest.mark.parametrize("splits", [1, 3])
def test_split_k_partials_sum_to_the_product_and_the_norm_reads_them(splits):
    from nanovllm_ref.kernels.rmsnorm import rms_norm_reference
    from perf.decode_gemms import reduce_add_rms_norm, splitk

    gen = torch.Generator().manual_seed(splits)
    m, n, k = 40, 96, 3 * 64  # rows past one 32-row tile, masked
    x, w = (torch.randn(*s, generator=gen).half().to(DEVICE) for s in ((m, k), (n, k)))
    parts = splitk(x, w, splits, (32, 32, 64, 4, 2))
    assert parts.shape == (splits, m, n)
    torch.testing.assert_close(parts.sum(0), x.float() @ w.float().t(), atol=1e-3, rtol=1e-3)
    res, weight = torch.randn(m, n, generator=gen).half().to(DEVICE), torch.rand(n, generator=gen).half().to(DEVICE)
    out, res_out = reduce_add_rms_norm(parts, res, weight, 1e-6)
    want_out, want_res = rms_norm_reference(parts.sum(0).half(), weight, 1e-6, res)
    # the partials' sum order may move a value by one rounding of the 16-bit result
    torch.testing.assert_close(res_out, want_res, atol=1e-3, rtol=2e-3)
    torch.testing.assert_close(out, want_out, atol=1e-3, rtol=2e-3)
