"""The fused QKV epilogue (q/k RMSNorm + RoPE + KV store) vs the unfused references.

Inputs are drawn fresh (hypothesis): any head count, GQA ratio, head_dim (also not a power of two), block size,
slots in any order with padding (-1) rows, with and without the q/k norm. The cache is poisoned with NaN before
the call: rows the kernel must not write stay NaN, rows it must write are compared. V is copied, so it is
compared bitwise; q and k go through the norm (float32 reduction order may differ by an ulp before the cast),
so they are compared with the dtype's relative tolerance. bfloat16 only on the GPU (see conftest.py).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm_ref.kernels.qkv_epilogue import qkv_epilogue, qkv_epilogue_reference
from nanovllm_ref.testing import RELATIVE_TOLERANCE, relative_error

from .conftest import DEVICE, DTYPES, ON_GPU, norm_weight, rope_inputs


@settings(max_examples=40 if ON_GPU else 12)
@given(
    tokens=st.integers(1, 12),
    kv_heads=st.sampled_from([1, 2, 3, 8]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([64, 80, 128]),
    block_size=st.sampled_from([1, 16]),
    qk_norm=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_qkv_epilogue_matches_reference(tokens, kv_heads, group, head_dim, block_size, qk_norm, dtype, seed):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    heads, num_blocks = kv_heads * group, tokens + 4  # enough slots for every token
    width = (heads + 2 * kv_heads) * head_dim
    qkv = (torch.randn(tokens, width, generator=gen, device=DEVICE) * 2).to(dtype)
    cos_sin, positions = rope_inputs(head_dim, tokens, gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=DEVICE)[:tokens]
    slots[torch.rand(tokens, generator=gen, device=DEVICE) < 0.25] = -1  # padding rows
    weights = [norm_weight(head_dim, gen, dtype) for _ in range(2)]
    qw, kw = weights if qk_norm else (None, None)
    caches = []
    for _ in range(2):  # (k_cache, v_cache) for the reference, then for the kernel; NaN = never written
        caches.append([torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype,
                                  device=DEVICE) for _ in range(2)])
    args = (qkv, positions, cos_sin, qw, kw, 1e-6)
    ref_q = qkv_epilogue_reference(*args, *caches[0], slots, heads, kv_heads)
    q = qkv_epilogue(*args, *caches[1], slots, heads, kv_heads)
    # a 1-ulp difference of the norm's output can grow in RoPE's rounded sums (cancellation): the dtype's tolerance
    tol = RELATIVE_TOLERANCE[dtype]
    assert q.shape == ref_q.shape and q.dtype == dtype
    assert relative_error(q, ref_q) < tol, ("q", relative_error(q, ref_q), (q - ref_q).abs().max().item())
    (ref_k, ref_v), (k, v) = caches
    assert torch.equal(ref_k.isnan(), k.isnan()) and torch.equal(ref_v.isnan(), v.isnan()), "written rows differ"
    written = ~ref_k.isnan()
    assert torch.equal(v[written], ref_v[written]), "V must be a bitwise copy"
    if written.any():
        assert relative_error(k[written], ref_k[written]) < tol, ("k", relative_error(k[written], ref_k[written]))
