"""FP8 (e4m3) KV cache: the Triton store, QKV epilogue, decode and prefill kernels against the torch references
(kernels/kv_quant.py's rule), on the interpreter off-GPU and compiled on a GPU.

Scales differ per KV head and between K and V, and are chosen below each head's amax / 448 so that some values
saturate (the clamp is exercised); the fp8 store is compared byte for byte (the quantization is deterministic).
Unused cache blocks stay NaN (e4m3fn has a NaN), so a kernel reading past a context fails.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm_ref.kernels.decode_attention import decode_attention, decode_attention_reference
from nanovllm_ref.kernels.kv_quant import FP8, dequantize_kv, quantize_kv
from nanovllm_ref.kernels.prefill_attention import prefill_attention, prefill_attention_reference
from nanovllm_ref.kernels.qkv_epilogue import qkv_epilogue, qkv_epilogue_reference
from nanovllm_ref.kernels.store_kv import store_kv, store_kv_reference
from nanovllm_ref.testing import RELATIVE_TOLERANCE, make_paged_batch, relative_error

from .conftest import DEVICE, DTYPES, ON_GPU, norm_weight, rope_inputs


def scales_for(k: torch.Tensor, v: torch.Tensor, seed: int) -> torch.Tensor:
    """(2, kv_heads): each head's finite amax / 448 times a factor in [0.5, 1.5) (below 1: values saturate)."""
    gen = torch.Generator().manual_seed(seed)
    amax = torch.stack([x.float().nan_to_num(0.0).abs().amax(dim=(0, 2)) for x in (k, v)]).cpu()
    return ((amax / 448 + 1e-6) * (0.5 + torch.rand(amax.shape, generator=gen))).to(k.device)


def fp8_caches(b, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch's caches quantized (NaN poison stays NaN) and their scales."""
    flat = [c.view(-1, *c.shape[2:]) for c in (b.k_cache, b.v_cache)]
    scales = scales_for(flat[0], flat[1], seed)
    k8, v8 = (quantize_kv(c, scales[i]).view(b.k_cache.shape) for i, c in enumerate(flat))
    return k8, v8, scales


@settings(max_examples=30 if ON_GPU else 10)
@given(tokens=st.integers(1, 40), kv_heads=st.sampled_from([1, 2, 3, 8]), head_dim=st.sampled_from([64, 80, 128]),
       block_size=st.sampled_from([16, 32]), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_store_kv_fp8_matches_reference_bytewise(tokens, kv_heads, head_dim, block_size, dtype, seed):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    k, v = (torch.randn(tokens, kv_heads, head_dim, generator=gen, device=DEVICE).to(dtype) for _ in range(2))
    k[0, 0, :3] = torch.tensor([1e4, -1e4, 0.0])  # far past the scale's range: saturates to +-448
    scales = scales_for(k, v, seed)
    num_blocks = -(-tokens // block_size) + 1
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=DEVICE)[:tokens]
    slots[torch.rand(tokens, generator=gen, device=DEVICE) < 0.2] = -1
    outs = []
    for fn in (store_kv, store_kv_reference):
        caches = [torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), device=DEVICE).to(FP8)
                  for _ in range(2)]
        fn(k, v, *caches, slots, scales)
        outs.append([c.view(torch.uint8) for c in caches])
    for got, want in zip(*outs):
        assert torch.equal(got, want)
    stored = dequantize_kv(outs[1][0].view(FP8).view(-1, kv_heads, head_dim), scales[0])
    assert stored.nan_to_num(0.0).abs().amax(dim=(0, 2)).le(448 * scales[0] * (1 + 1e-6)).all()


@settings(max_examples=20 if ON_GPU else 8)
@given(tokens=st.integers(1, 8), kv_heads=st.sampled_from([1, 2, 8]), group=st.sampled_from([1, 4]),
       head_dim=st.sampled_from([64, 128]), qk_norm=st.booleans(), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2**31 - 1))
def test_qkv_epilogue_fp8_matches_reference(tokens, kv_heads, group, head_dim, qk_norm, dtype, seed):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    heads, block_size = kv_heads * group, 16
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen, device=DEVICE) * 2).to(dtype)
    cos_sin, positions = rope_inputs(head_dim, tokens, gen)
    slots = torch.randperm(2 * block_size, generator=gen, device=DEVICE)[:tokens]
    qw, kw = (norm_weight(head_dim, gen, dtype), norm_weight(head_dim, gen, dtype)) if qk_norm else (None, None)
    scales = (torch.rand(2, kv_heads, generator=gen, device=DEVICE) + 0.5) / 100  # |x| > 4.5: saturated
    outs = []
    for fn in (qkv_epilogue, qkv_epilogue_reference):
        caches = [torch.zeros(2, block_size, kv_heads, head_dim, device=DEVICE).to(FP8) for _ in range(2)]
        fn(qkv, positions, cos_sin, qw, kw, 1e-6, *caches, slots, heads, kv_heads, scales)
        outs.append([dequantize_kv(c.view(-1, kv_heads, head_dim), scales[i]) for i, c in enumerate(caches)])
    v_got, v_want = outs[0][1], outs[1][1]
    assert torch.equal(v_got, v_want)  # V is only quantized: the same bytes
    # k went through norm + RoPE (an ulp of reduction order may move a value across an e4m3 rounding boundary)
    k_got, k_want = outs[0][0], outs[1][0]
    assert ((k_got - k_want).abs() > 0).float().mean() < 0.05
    assert relative_error(k_got, k_want) < 2**-4


@pytest.mark.parametrize("case", ["decode", "prefill", "prefill-cached-prefix"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_reads_fp8_cache(case, dtype):
    ctx, q = {"decode": ([70, 17, 130], [1, 1, 1]), "prefill": ([40, 9], [40, 9]),
              "prefill-cached-prefix": ([70, 33], [5, 33])}[case]
    for seed, (kv_heads, group, head_dim) in enumerate([(2, 4, 64), (1, 2, 80)]):
        b = make_paged_batch(ctx, q, num_kv_heads=kv_heads, group=group, head_dim=head_dim, block_size=16,
                             dtype=dtype, device=DEVICE, seed=seed)
        k8, v8, scales = fp8_caches(b, seed)
        if case == "decode":
            ref = decode_attention_reference(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, scales)
            out = decode_attention(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, kv_scales=scales)
        else:
            args = (b.q, k8, v8, b.query_start_loc, b.seq_lens, b.block_tables, b.scale)
            ref = prefill_attention_reference(*args, scales)
            out = prefill_attention(*args, b.max_query_len, kv_scales=scales)
        assert out.isfinite().all()
        assert relative_error(out, ref) < RELATIVE_TOLERANCE[dtype] * 2, (case, seed)
        # the scales matter: reading the cache as if unscaled is far off
        unscaled = decode_attention_reference(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale) \
            if case == "decode" else None
        if unscaled is not None:
            assert relative_error(unscaled, ref) > 0.1


@pytest.mark.parametrize("tile", ["FP8_DECODE_TILE", "FP8_DECODE_TILE_WIDE"])
@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if ON_GPU else []))
def test_decode_fp8_tiles(tile, dtype):
    """Both fp8 decode tiles (on sm_89+ GPUs V converted by PTX, attend_tile's V_PTX): contexts of whole
    32- and 64-key tiles, partial last tiles and one shorter than a tile; head_dim 128 (unmasked full tiles) and 80."""
    from nanovllm_ref.kernels import decode_attention as da

    for seed, (kv_heads, group, head_dim) in enumerate([(2, 2, 128), (1, 4, 80)]):
        b = make_paged_batch([128, 17, 96, 201], [1, 1, 1, 1], num_kv_heads=kv_heads, group=group,
                             head_dim=head_dim, block_size=16, dtype=dtype, device=DEVICE, seed=seed)
        k8, v8, scales = fp8_caches(b, seed)
        ref = decode_attention_reference(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, scales)
        out = decode_attention(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, kv_scales=scales,
                               tile_config=getattr(da, tile))
        assert out.isfinite().all()
        assert relative_error(out, ref) < RELATIVE_TOLERANCE[dtype] * 2, (tile, seed)


@pytest.mark.parametrize("fp8", [True, False])
def test_decode_swapped_products(fp8, monkeypatch):
    """attend_tile's SWAP (keys as the MMA's rows): float16 products, so that the interpreter runs them too (off-GPU
    the kernels otherwise upcast to float32, which skips the swapped dots); one split and three, groups of 2 and 4,
    head_dim 128 and 80 (masked columns), contexts of whole, partial and sub-tile lengths."""
    from nanovllm_ref.kernels import decode_attention as da

    monkeypatch.setattr(da, "upcast_dots", lambda device: False)
    for seed, (kv_heads, group, head_dim) in enumerate([(2, 2, 128), (1, 4, 80)]):
        b = make_paged_batch([128, 17, 96, 201], [1, 1, 1, 1], num_kv_heads=kv_heads, group=group,
                             head_dim=head_dim, block_size=16, dtype=torch.float16, device=DEVICE, seed=seed)
        k, v, scales = fp8_caches(b, seed) if fp8 else (b.k_cache, b.v_cache, None)
        ref = decode_attention_reference(b.q, k, v, b.block_tables, b.seq_lens, b.scale, scales)
        for splits in (1, 3):
            out = decode_attention(b.q, k, v, b.block_tables, b.seq_lens, b.scale, kv_scales=scales, num_splits=splits,
                                   tile_config={"BLOCK_N": 32, "num_warps": 1, "num_stages": 2, "SWAP": True})
            assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.float16] * 2, (seed, splits)


def test_decode_fp8_tile_choice():
    """The fp8 tile with three buffers per load once the batch gives every SM 8 programs; the bf16 cache's tile does not
    depend on it."""
    from nanovllm_ref.kernels import decode_attention as da

    def cfg(fp8, per_sm):
        return da.decode_tile_config(128, torch.bfloat16, fp8, per_sm)

    assert cfg(True, da.FP8_WIDE_PROGRAMS_PER_SM) == da.FP8_DECODE_TILE_WIDE
    assert cfg(True, 2048 / 132) == da.FP8_DECODE_TILE_WIDE  # the headline's first decode step on an H200
    assert cfg(True, 720 / 132) == da.FP8_DECODE_TILE
    assert cfg(False, 2048 / 132) == cfg(False, 1.0) != da.FP8_DECODE_TILE_WIDE
