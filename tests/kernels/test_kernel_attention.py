"""Triton decode/prefill attention vs the references, on paged batches drawn by nanovllm_ref.testing.

Outputs (and the decode split workspace) are pre-filled with NaN, so an element the kernel fails to write
shows up; unused cache blocks and rows past seq_len are NaN too (or large garbage), so a kernel that reads past
a sequence's context fails. On CPU the kernels run in the Triton interpreter with small shapes, in float32 and
float16 (the interpreter's bfloat16 rounding is not the GPU's); on a GPU bfloat16 is added.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm_ref.kernels.decode_attention import (
    decode_attention,
    decode_attention_reference,
    decode_workspace_numel,
)
from nanovllm_ref.kernels.prefill_attention import prefill_attention, prefill_attention_reference
from nanovllm_ref.testing import RELATIVE_TOLERANCE, make_paged_batch, paged_batches, relative_error

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPES = (torch.float32, torch.float16, torch.bfloat16) if ON_GPU else (torch.float32, torch.float16)
# The interpreter costs ~10 ms per program and tile: keep CPU batches tiny, GPU ones bigger.
MAX_SEQS, MAX_CONTEXT = (8, 1100) if ON_GPU else (3, 150)
DECODE_EXAMPLES, PREFILL_EXAMPLES = (40, 40) if ON_GPU else (25, 20)
HEAD_DIMS = (64, 128, 96)


def _nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def check_decode(b, num_splits=None, **kw):
    ref = decode_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    out = _nan_like(b.q)
    ws = None
    if num_splits is not None and num_splits > 1:
        numel = decode_workspace_numel(b.num_seqs, b.num_heads, b.head_dim, num_splits)
        ws = torch.full((numel,), float("nan"), device=b.q.device)
    res = decode_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale,
                           num_splits=num_splits, out=out, workspace=ws, **kw)
    assert res is out
    assert out.isfinite().all(), "decode_attention left unwritten (NaN) outputs or read poisoned KV"
    err = relative_error(out, ref)
    assert err < RELATIVE_TOLERANCE[b.q.dtype], (err, b.context_lens, b.block_size, b.head_dim, b.group)


def check_prefill(b, max_query_len="auto"):
    ref = prefill_attention_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens,
                                      b.block_tables, b.scale)
    out = _nan_like(b.q)
    mql = b.max_query_len if max_query_len == "auto" else max_query_len
    prefill_attention(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, b.scale,
                      mql, out=out)
    assert out.isfinite().all(), "prefill_attention left unwritten (NaN) outputs or read poisoned KV"
    err = relative_error(out, ref)
    assert err < RELATIVE_TOLERANCE[b.q.dtype], (err, b.context_lens, b.query_lens, b.block_size, b.group)


@settings(max_examples=DECODE_EXAMPLES)
@given(
    b=paged_batches(head_dims=HEAD_DIMS, max_seqs=MAX_SEQS + 1, max_context=MAX_CONTEXT, decode_only=True,
                    dtype=DTYPES, device=DEVICE, poison=("nan", "large")),
    num_splits=st.sampled_from([None, 1, 2, 3, 5]),
)
def test_decode_attention(b, num_splits):
    check_decode(b, num_splits)


@settings(max_examples=PREFILL_EXAMPLES)
@given(b=paged_batches(head_dims=HEAD_DIMS, max_seqs=MAX_SEQS, max_context=MAX_CONTEXT, dtype=DTYPES,
                       device=DEVICE, poison=("nan", "large")),
       hint=st.booleans())
def test_prefill_attention(b, hint):
    check_prefill(b, "auto" if hint else None)


@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("group", [1, 8])
def test_decode_gqa_and_block_extremes(block_size, group):
    b = make_paged_batch([block_size + 7, 1, 70], [1, 1, 1], num_kv_heads=2, group=group, head_dim=64,
                         block_size=block_size, dtype=torch.float16, device=DEVICE, seed=group + block_size)
    check_decode(b, num_splits=None)
    check_decode(b, num_splits=4)


@pytest.mark.parametrize("head_dim", [80, 32])
def test_odd_head_dims(head_dim):
    b = make_paged_batch([40, 17], [1, 17], num_kv_heads=1, group=4, head_dim=head_dim, block_size=16,
                         device=DEVICE, seed=head_dim)
    check_prefill(b)
    d = make_paged_batch([40, 17], [1, 1], num_kv_heads=1, group=4, head_dim=head_dim, block_size=16,
                         device=DEVICE, seed=head_dim)
    check_decode(d, num_splits=2)


def test_prefill_prefix_and_chunk_shapes():
    # fresh prompt, prefix hit ending mid-block, single token, a chunk longer than one query tile
    b = make_paged_batch([33, 90, 5, 140], [33, 21, 1, 100], num_kv_heads=2, group=2, head_dim=64,
                         block_size=32, dtype=torch.float16, device=DEVICE, seed=7)
    check_prefill(b)
    check_prefill(b, max_query_len=None)  # read on the host


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_padded_slot_gives_zero(num_splits):
    """seq_len 0 (a CUDA-graph padding slot): the reference yields zeros; so must the kernel."""
    b = make_paged_batch([20, 1], [1, 1], num_kv_heads=1, group=2, head_dim=64, block_size=16,
                         device=DEVICE, seed=3)
    seq_lens = b.seq_lens.clone()
    seq_lens[1] = 0
    ref = decode_attention_reference(b.q, b.k_cache, b.v_cache, b.block_tables, seq_lens, b.scale)
    out = decode_attention(b.q, b.k_cache, b.v_cache, b.block_tables, seq_lens, b.scale, num_splits=num_splits)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(ref[1], out[1])
    assert relative_error(out[0], ref[0]) < 1e-4


def test_decode_slow_mode_still_correct(monkeypatch):
    monkeypatch.setenv("NANOVLLM_REF_SLOW_KERNELS", "1")
    b = make_paged_batch([100, 3], [1, 1], num_kv_heads=2, group=4, head_dim=64, block_size=16,
                         device=DEVICE, seed=5)
    check_decode(b, num_splits=2)
    check_decode(b, num_splits=None, max_seq_len=100)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_order_is_bitwise_the_same(num_splits):
    """`order` only changes which program takes which sequence (longest first): every output is bitwise the one
    without it, for any permutation."""
    b = make_paged_batch([5, 90, 33, 1, 64], [1] * 5, num_kv_heads=2, group=2, head_dim=64, block_size=16,
                         device=DEVICE, seed=11)
    plain = decode_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale, num_splits=num_splits)
    for order in (torch.argsort(b.seq_lens, descending=True), torch.tensor([3, 0, 4, 2, 1])):
        out = decode_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale,
                               num_splits=num_splits, order=order.to(DEVICE))
        assert torch.equal(out, plain)
    check_decode(b, num_splits=num_splits, order=torch.argsort(b.seq_lens, descending=True))
