"""The sweep's fp8 decode variants (perf/fp8_decode_variants.py) compute decode attention over an fp8 cache: CVT 0
with one and two tiles per loop iteration against the torch reference, in Triton's interpreter off-GPU (the inline-PTX
conversions, CVT 1-3, run on a GPU only: `python -m perf.fp8_decode_sweep` checks them there against the engine)."""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref.kernels.decode_attention import decode_attention_reference
from nanovllm_ref.kernels.kv_quant import quantize_kv
from nanovllm_ref.testing import make_paged_batch, relative_error
from nanovllm_ref.testing.mismatch import triton_unavailable

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.skipif(triton_unavailable() is not None, reason=str(triton_unavailable()))
@pytest.mark.parametrize("pairs", [False, True])
def test_fp8_variant_matches_reference(pairs):
    from perf.fp8_decode_variants import decode_fp8_variant

    # contexts: none, one partial tile, pairs plus a lone full tile plus a partial one (tiles of 16 keys)
    b = make_paged_batch([5, 16, 87, 40], [1, 1, 1, 1], num_kv_heads=2, group=2, head_dim=64, block_size=16,
                         dtype=torch.float16, device=DEVICE, seed=3)
    flat = [c.view(-1, 2, 64) for c in (b.k_cache, b.v_cache)]  # unused rows stay NaN: reading them fails
    scales = torch.stack([x.float().nan_to_num(0.0).abs().amax(dim=(0, 2)) / 300 for x in flat]).to(DEVICE)
    k8, v8 = (quantize_kv(c, scales[i]).view(b.k_cache.shape) for i, c in enumerate(flat))
    want = decode_attention_reference(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, scales)
    order = torch.argsort(b.seq_lens, descending=True).to(torch.int32)
    tile = {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1, "CVT": 0, "PAIRS": pairs}
    got = decode_fp8_variant(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, scales, order=order, tile=tile)
    assert relative_error(got.float(), want.float()) < 2e-3


@pytest.mark.skipif(triton_unavailable() is not None, reason=str(triton_unavailable()))
@pytest.mark.parametrize("block_n", [8, 16])
def test_fp8_transposed_v_variant_matches_reference(block_n):
    from perf.fp8_decode_variants import decode_fp8_vt_variant, transpose_v_blocks

    # one split with a partial last tile, two splits (num_splits=2), a lone partial tile; 2 tiles per block at 8
    b = make_paged_batch([5, 16, 87, 40], [1, 1, 1, 1], num_kv_heads=2, group=2, head_dim=64, block_size=16,
                         dtype=torch.float16, device=DEVICE, seed=4)
    flat = [c.view(-1, 2, 64) for c in (b.k_cache, b.v_cache)]
    scales = torch.stack([x.float().nan_to_num(0.0).abs().amax(dim=(0, 2)) / 300 for x in flat]).to(DEVICE)
    k8, v8 = (quantize_kv(c, scales[i]).view(b.k_cache.shape) for i, c in enumerate(flat))  # NaN rows stay NaN
    want = decode_attention_reference(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, scales)
    order = torch.argsort(b.seq_lens, descending=True).to(torch.int32)
    for splits in (1, 2):
        got = decode_fp8_vt_variant(b.q, k8, transpose_v_blocks(v8), b.block_tables, b.seq_lens, b.scale, scales,
                                    order=order, tile={"BLOCK_N": block_n, "num_warps": 1, "num_stages": 1},
                                    num_splits=splits)
        assert relative_error(got.float(), want.float()) < 2e-3, splits
