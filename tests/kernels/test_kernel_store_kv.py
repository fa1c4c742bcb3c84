"""Triton store_kv vs store_kv_reference: exact (it is a copy), padding rows (-1) skipped, nothing else
touched. The target slots are poisoned first, so a missed write stays NaN (or large garbage)."""

from __future__ import annotations

import torch
from hypothesis import given, settings

from nanovllm_ref.kernels.store_kv import store_kv, store_kv_reference
from nanovllm_ref.testing import make_paged_batch, paged_batches

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # a copy: bf16 is exact in the interpreter too


def check_store(b, key=None, value=None):
    key = b.key if key is None else key
    value = b.value if value is None else value
    k_ref, v_ref = b.poisoned_caches()
    k_out, v_out = b.poisoned_caches()
    store_kv_reference(key, value, k_ref, v_ref, b.slot_mapping)
    store_kv(key, value, k_out, v_out, b.slot_mapping)
    torch.testing.assert_close(k_out, k_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_out, v_ref, rtol=0, atol=0, equal_nan=True)
    if key is b.key:  # the stored rows restore exactly the batch's caches
        torch.testing.assert_close(k_out, b.k_cache, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(v_out, b.v_cache, rtol=0, atol=0, equal_nan=True)


@settings(max_examples=40 if ON_GPU else 20)
@given(b=paged_batches(head_dims=(64, 128, 80), num_kv_heads=(1, 2, 3, 8), max_seqs=4,
                       max_context=600 if ON_GPU else 40, dtype=DTYPES, device=DEVICE,
                       poison=("nan", "large")))
def test_store_kv(b):
    check_store(b)


def test_store_kv_strided_inputs_and_int64_slots():
    """key/value as views of a fused qkv projection (token stride > heads x dim), int64 slot mapping."""
    b = make_paged_batch([37, 5], [20, 5], num_kv_heads=2, group=2, head_dim=96, block_size=16,
                         dtype=torch.float16, device=DEVICE, seed=11, num_pad=3)
    qkv = torch.randn(b.key.shape[0], 4 + 2 + 2, 96, dtype=torch.float16, device=DEVICE)
    qkv[:, 4:6] = b.key
    qkv[:, 6:8] = b.value
    b.slot_mapping = b.slot_mapping.long()
    check_store(b, key=qkv[:, 4:6], value=qkv[:, 6:8])
