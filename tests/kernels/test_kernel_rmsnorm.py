"""Triton rms_norm (optionally fused with the residual add) vs its reference.

The residual sum follows the reference's rounding points exactly, so it is
compared bitwise; the normalized output differs only by float32 reduction order / hardware rsqrt before its
final cast, so it is compared with the relative tolerances. bfloat16 only on GPU (the interpreter truncates
float32 -> bfloat16 instead of rounding to nearest).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm_ref.kernels.rmsnorm import rms_norm, rms_norm_reference
from nanovllm_ref.testing import RELATIVE_TOLERANCE, relative_error

from .conftest import DEVICE, DTYPES, ON_GPU, norm_weight


@settings(max_examples=30 if ON_GPU else 15)
@given(
    tokens=st.integers(1, 9),
    hidden=st.sampled_from([64, 96, 200, 1024, 4096]),
    dtype=st.sampled_from(DTYPES),
    weight_fp32=st.booleans(),
    with_residual=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_rms_norm(tokens, hidden, dtype, weight_fp32, with_residual, seed):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen, device=DEVICE).to(dtype) * 3
    res = torch.randn(tokens, hidden, generator=gen, device=DEVICE).to(dtype) if with_residual else None
    w = norm_weight(hidden, gen, torch.float32 if weight_fp32 else dtype)
    ref = rms_norm_reference(x, w, 1e-6, res)
    out = rms_norm(x, w, 1e-6, res)
    if with_residual:
        assert torch.equal(out[1], ref[1]), "the residual sum must be bitwise the reference's"
        out, ref = out[0], ref[0]
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert relative_error(out, ref) < RELATIVE_TOLERANCE[dtype] / 10

