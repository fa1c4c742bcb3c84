"""Full-size kernel tests (bf16, serving shapes), CUDA-graph capture and no-host-sync checks: GPU only."""

from __future__ import annotations

import random

import pytest
import torch

from nanovllm_ref.kernels.decode_attention import decode_attention, decode_attention_reference
from nanovllm_ref.kernels.prefill_attention import prefill_attention, prefill_attention_reference
from nanovllm_ref.kernels.store_kv import store_kv
from nanovllm_ref.testing import RELATIVE_TOLERANCE, make_paged_batch, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _lengths(n: int, lo: int, hi: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(lo, hi) for _ in range(n)]


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(32, 8), (16, 8)])
def test_decode_full_bf16(block_size, num_heads, num_kv_heads):
    ctx = _lengths(64, 3000, 4096, seed=block_size)  # mostly not multiples of the block size
    b = make_paged_batch(ctx, [1] * 64, num_kv_heads=num_kv_heads, group=num_heads // num_kv_heads,
                         head_dim=128, block_size=block_size, dtype=torch.bfloat16, device="cuda", seed=1)
    ref = decode_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    for splits in (None, 1, 4):
        out = torch.full_like(b.q, float("nan"))
        decode_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale, num_splits=splits, out=out)
        assert out.isfinite().all()
        assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("block_size", [16, 256])
def test_prefill_full_bf16(block_size):
    # fresh 4k prompt, prefix-cache hit, chunk of a long prompt, a decode token, a short prompt
    ctx, qlen = [4096, 3000, 6000, 2500, 77], [4096, 1000, 512, 1, 77]
    b = make_paged_batch(ctx, qlen, num_kv_heads=8, group=4, head_dim=128, block_size=block_size,
                         dtype=torch.bfloat16, device="cuda", seed=2)
    ref = prefill_attention_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens,
                                      b.block_tables, b.scale)
    out = torch.full_like(b.q, float("nan"))
    prefill_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, b.scale,
                      out=out)
    assert out.isfinite().all()
    assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("head_dim", [64, 256])
def test_prefill_and_decode_other_head_dims(head_dim):
    b = make_paged_batch([900, 1500], [900, 300], num_kv_heads=2, group=8, head_dim=head_dim, block_size=32,
                         dtype=torch.bfloat16, device="cuda", seed=3)
    ref = prefill_attention_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens,
                                      b.block_tables, b.scale)
    out = prefill_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, b.scale)
    assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.bfloat16]
    d = make_paged_batch([900, 1500], [1, 1], num_kv_heads=2, group=8, head_dim=head_dim, block_size=32,
                         dtype=torch.bfloat16, device="cuda", seed=3)
    ref = decode_attention_reference(d.q, d.k_cache, d.v_cache, d.block_tables, d.seq_lens, d.scale)
    out = decode_attention(d.q, d.k_cache, d.v_cache, d.block_tables, d.seq_lens, d.scale)
    assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.bfloat16]


def test_store_kv_16k_tokens():
    b = make_paged_batch([2048] * 8, [2048] * 8, num_kv_heads=8, group=2, head_dim=128, block_size=16,
                         dtype=torch.bfloat16, device="cuda", seed=4, num_pad=64)
    k, v = b.poisoned_caches()
    store_kv(b.key, b.value, k, v, b.slot_mapping)
    torch.testing.assert_close(k, b.k_cache, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v, b.v_cache, rtol=0, atol=0, equal_nan=True)


def test_decode_and_store_no_host_sync():
    b = make_paged_batch([700, 30, 1], [1, 1, 1], num_kv_heads=8, group=4, head_dim=128, block_size=16,
                         dtype=torch.bfloat16, device="cuda", seed=5)
    args = (b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    decode_attention(*args)  # compile first (compilation itself may sync)
    decode_attention(*args, num_splits=4)
    store_kv(b.key, b.value, b.k_cache, b.v_cache, b.slot_mapping)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        decode_attention(*args)
        decode_attention(*args, num_splits=4)
        store_kv(b.key, b.value, b.k_cache, b.v_cache, b.slot_mapping)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("num_splits", [None, 4])
def test_decode_cuda_graph_replay(num_splits):
    """Capture store_kv + decode_attention once, then replay with new lengths/queries written in place."""
    batch, width = 16, 64
    b = make_paged_batch(_lengths(batch, 100, 1000, 6), [1] * batch, num_kv_heads=8, group=4, head_dim=128,
                         block_size=16, dtype=torch.bfloat16, device="cuda", seed=6, extra_columns=width, num_pad=0)
    q, seq_lens, tables = b.q.clone(), b.seq_lens.clone(), b.block_tables.clone()
    key, value, slots = b.key.clone(), b.value.clone(), b.slot_mapping.clone()
    k_cache, v_cache = b.k_cache.clone(), b.v_cache.clone()

    def step():
        store_kv(key, value, k_cache, v_cache, slots)
        return decode_attention(q, k_cache, v_cache, tables, seq_lens, b.scale, num_splits=num_splits)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()

    # step 2: every sequence shrinks (as if another batch reused the graph) with fresh queries
    seq_lens.copy_(torch.clamp(b.seq_lens - 37, min=1))
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    ref = decode_attention_reference(q, k_cache, v_cache, tables, seq_lens, b.scale)
    assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.bfloat16]
