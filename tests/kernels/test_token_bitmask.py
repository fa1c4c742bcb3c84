"""The token-bitmask kernel (kernels/token_bitmask.py) against its reference and a per-token loop: -inf exactly where
a masked row's bit is clear, the other logits and the rows no bitmask row names untouched (bitwise)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanovllm_ref.kernels.token_bitmask import apply_token_bitmask, apply_token_bitmask_reference

from .conftest import DEVICE, DTYPES, ON_GPU


def by_loop(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    out = logits.clone()
    words = bitmask.tolist()
    for i, r in enumerate(rows):
        for v in range(logits.shape[1]):
            if not (words[i][v // 32] >> (v % 32)) & 1:
                out[r, v] = float("-inf")
    return out


@settings(max_examples=30 if ON_GPU else 12)
@given(n=st.integers(1, 6), vocab=st.sampled_from([1, 31, 32, 33, 100, 1024, 1536, 2100]),
       dtype=st.sampled_from(DTYPES), density=st.sampled_from([0.0, 0.02, 0.5, 1.0]), extra_words=st.integers(0, 1),
       seed=st.integers(0, 2**31 - 1))
def test_kernel_reference_and_loop_agree(n, vocab, dtype, density, extra_words, seed):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen, device=DEVICE).to(dtype)
    rows = torch.randperm(n, generator=gen, device=DEVICE)[: max(1, n - 1)]  # a subset, in any order
    words = -(-vocab // 32) + extra_words  # (a wider bitmask: the bits past vocab are ignored)
    bits = torch.rand(len(rows), words * 32, generator=gen, device=DEVICE) < density
    weights = 2 ** torch.arange(32, dtype=torch.int64, device=DEVICE)
    bitmask = (bits.view(len(rows), words, 32).long() * weights).sum(-1)  # (m, words) in [0, 2^32)
    bitmask = torch.where(bitmask >= 2**31, bitmask - 2**32, bitmask).to(torch.int32)
    expected = by_loop(logits.cpu(), bitmask.cpu(), rows.tolist())
    ref = apply_token_bitmask_reference(logits.clone(), bitmask, rows)
    out = apply_token_bitmask(logits.clone(), bitmask, rows)
    assert torch.equal(ref.cpu(), expected) and torch.equal(out.cpu(), expected)


def test_in_place_and_no_rows():
    logits = torch.randn(3, 40, device=DEVICE)
    before = logits.clone()
    bitmask = torch.tensor([[0b101, 0]], dtype=torch.int32, device=DEVICE)  # tokens 0 and 2 of row 1
    rows = torch.tensor([1], device=DEVICE)
    for fn in (apply_token_bitmask, apply_token_bitmask_reference):
        x = before.clone()
        assert fn(x, bitmask, rows) is x
        assert torch.equal(x[[0, 2]], before[[0, 2]]) and x[1].isfinite().nonzero().flatten().tolist() == [0, 2]
        assert torch.equal(fn(before.clone(), bitmask[:0], rows[:0]), before)


def test_the_kernel_refuses_a_bitmask_too_narrow():
    logits = torch.randn(2, 100, device=DEVICE)
    with pytest.raises(ValueError, match="a bitmask of"):
        apply_token_bitmask(logits, torch.zeros(1, 3, dtype=torch.int32, device=DEVICE), torch.tensor([0]))
