"""The flash-attn backend's plumbing, on the CPU, against a stand-in `flash_attn` module.

flash-attn cannot be installed on the machines this project is tested on, so these tests check what is ours:
the calls the backend makes (paged K/V, block table, cumulative context lengths, one query row per sequence in
decode) against a stand-in written from FlashAttention-2's documented semantics (`flash_attn_interface.py`:
paged caches of shape (num_blocks, page_size, kv_heads, head_dim), page_size a multiple of 256, int32
cu_seqlens / cache_seqlens / block_table, causal mask aligned to the end of each context), which also checks the
argument types and shapes the real kernels require. Results must equal the torch reference backend. The
selection rules and the clear errors are checked too.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from nanovllm_ref.attention import BACKENDS, AttentionMetadata, resolve_backend_name
from nanovllm_ref.attention.flash_attn_backend import FlashAttnBackend
from nanovllm_ref.attention.torch_backend import TorchBackend
from nanovllm_ref.config import BACKEND_NAMES
from nanovllm_ref.testing.strategies import make_paged_batch


def _attend(q, k_cache, v_cache, table, ctx_len, scale, causal):  # q (sq, h, d) -> (sq, h, d)
    page = k_cache.shape[1]
    pages = table[: -(-ctx_len // page)].long()
    k = k_cache[pages].flatten(0, 1)[:ctx_len]  # (ctx, kv_heads, d): never reads past the context
    v = v_cache[pages].flatten(0, 1)[:ctx_len]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if causal:  # bottom-right aligned: query i sits at position ctx_len - sq + i
        sq = q.shape[0]
        allowed = torch.arange(ctx_len)[None, :] <= torch.arange(ctx_len - sq, ctx_len)[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(q.dtype)


def _check_paged(k_cache, block_table, *int32):
    assert k_cache.dim() == 4 and k_cache.shape[1] % 256 == 0, "page size must be a multiple of 256"
    assert block_table.dtype == torch.int32 and block_table.dim() == 2
    assert all(t.dtype == torch.int32 for t in int32)


def _fake_flash_attn() -> types.ModuleType:
    mod = types.ModuleType("flash_attn")

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens, block_table,
                                softmax_scale, causal=False, **_):
        assert q.dim() == 4 and k is None and v is None  # (batch, seqlen_q, heads, d); cache already written
        _check_paged(k_cache, block_table, cache_seqlens)
        return torch.stack([_attend(q[b], k_cache, v_cache, block_table[b], int(cache_seqlens[b]), softmax_scale,
                                    causal) for b in range(q.shape[0])])

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, block_table=None, **_):
        assert q.dim() == 3 and dropout_p == 0.0 and block_table is not None
        _check_paged(k, block_table, cu_seqlens_q, cu_seqlens_k)
        out = torch.empty_like(q)
        for b in range(len(cu_seqlens_q) - 1):
            q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
            ctx = int(cu_seqlens_k[b + 1] - cu_seqlens_k[b])
            assert q1 - q0 <= max_seqlen_q and ctx <= max_seqlen_k
            out[q0:q1] = _attend(q[q0:q1], k, v, block_table[b], ctx, softmax_scale, causal)
        return out

    mod.flash_attn_with_kvcache, mod.flash_attn_varlen_func = flash_attn_with_kvcache, flash_attn_varlen_func
    mod.__spec__ = types.SimpleNamespace(name="flash_attn")
    return mod


@pytest.fixture
def fake_flash_attn(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", _fake_flash_attn())


@pytest.mark.parametrize("case", [
    ([300, 1, 700, 256], [1, 1, 1, 1]),  # decode: one query token per sequence
    ([300, 20, 700, 513], [300, 20, 5, 1]),  # prefill, chunked prefill over a cached prefix, a decode mixed in
])
def test_flash_attn_backend_matches_the_torch_reference(fake_flash_attn, case):
    ctx_lens, q_lens = case
    b = make_paged_batch(ctx_lens, q_lens, num_kv_heads=2, group=4, head_dim=64, block_size=256, seed=7)
    meta = AttentionMetadata(slot_mapping=b.slot_mapping.long(), query_start_loc=b.query_start_loc,
                             seq_lens=b.seq_lens, block_tables=b.block_tables, max_query_len=max(q_lens),
                             max_seq_len=1024)
    args = (b.num_heads, b.num_kv_heads, b.head_dim, b.scale)
    ref = TorchBackend(*args).forward(b.q, b.k_cache, b.v_cache, meta)
    out = FlashAttnBackend(*args).forward(b.q, b.k_cache, b.v_cache, meta)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_flash_attn_is_chosen_only_when_it_imports_and_fits(monkeypatch):
    monkeypatch.setattr("nanovllm_ref.config.flash_attn_available", lambda: True)
    assert resolve_backend_name("auto", "cuda", 256) == "flash-attn"
    assert resolve_backend_name("auto", "cuda", 16) == "triton"  # FA2's pages are multiples of 256 tokens
    assert resolve_backend_name("auto", "cpu", 256) == "sdpa"
    assert BACKENDS["flash-attn"] is FlashAttnBackend and sorted(BACKENDS) == sorted(BACKEND_NAMES)
    monkeypatch.setattr("nanovllm_ref.config.flash_attn_available", lambda: False)
    assert resolve_backend_name("auto", "cuda", 256) == "triton"


def test_flash_attn_refusals_name_the_limit(monkeypatch):
    monkeypatch.setattr("nanovllm_ref.attention.flash_attn_backend.flash_attn_available", lambda: False)
    with pytest.raises(ValueError, match="needs the flash_attn package"):
        FlashAttnBackend.check_supported("cuda", 256, 128)
    monkeypatch.setattr("nanovllm_ref.attention.flash_attn_backend.flash_attn_available", lambda: True)
    with pytest.raises(ValueError, match="kvcache_block_size to be a multiple of 256.*got 16"):
        FlashAttnBackend.check_supported("cuda", 16, 128)
    with pytest.raises(ValueError, match="CUDA only"):
        FlashAttnBackend.check_supported("cpu", 256, 128)
    FlashAttnBackend.check_supported("cuda", 512, 128)
