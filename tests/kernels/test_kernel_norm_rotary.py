"""Triton rms_norm (optionally fused with the residual add) and apply_rotary vs their references.

The residual sum and 16-bit rotary outputs follow the reference's rounding points exactly, so they are
compared bitwise; the normalized output differs only by float32 reduction order / hardware rsqrt before its
final cast, so it is compared with the relative tolerances. bfloat16 only on GPU (the interpreter truncates
float32 -> bfloat16 instead of rounding to nearest).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm_ref.kernels.rmsnorm import rms_norm, rms_norm_reference
from nanovllm_ref.kernels.rotary import apply_rotary, apply_rotary_reference
from nanovllm_ref.testing import RELATIVE_TOLERANCE, relative_error

from .conftest import DEVICE, DTYPES, ON_GPU, norm_weight, rope_inputs


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


@settings(max_examples=30 if ON_GPU else 15)
@given(
    tokens=st.integers(1, 9),
    num_heads=st.sampled_from([1, 2, 5, 8]),
    head_dim=st.sampled_from([64, 128, 96]),
    dtype=st.sampled_from(DTYPES),
    strided=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_apply_rotary(tokens, num_heads, head_dim, dtype, strided, seed):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    cache, positions = rope_inputs(head_dim, tokens, gen)
    x = torch.randn(tokens, num_heads + 3, head_dim, generator=gen, device=DEVICE).to(dtype)
    x = x[:, 1 : num_heads + 1] if strided else x[:, :num_heads].contiguous()  # a view into fused qkv
    ref = apply_rotary_reference(x, positions, cache)
    out = apply_rotary(x, positions, cache)
    if dtype == torch.float32:  # the GPU may contract a product and the sum into an FMA
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    else:  # products rounded to the dtype as the reference; the GPU may round a product differently by 1 ulp
        tol = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
