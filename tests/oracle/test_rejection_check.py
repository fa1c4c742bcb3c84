"""oracle/rejection_check.py: nanovllm_ref's rejection samplers pass it, and samplers that break the rule fail it."""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref.kernels.rejection import rejection_sample_reference
from nanovllm_ref.oracle.rejection_check import check_rejection_sampler


def test_the_reference_passes():
    assert check_rejection_sampler(rejection_sample_reference) == []


def test_the_triton_kernel_passes():
    from nanovllm_ref.testing.interpreter import use_triton_interpreter
    from nanovllm_ref.testing.mismatch import triton_unavailable

    use_triton_interpreter()
    if triton_unavailable():
        pytest.skip(triton_unavailable())
    from nanovllm_ref.kernels.rejection import rejection_sample

    assert check_rejection_sampler(rejection_sample, "cuda" if torch.cuda.is_available() else "cpu") == []


def accept_all(p, q, drafts, n, seeds, positions):  # q taken as p: min(1, p/q) = 1
    return rejection_sample_reference(p, p[:, :-1].contiguous(), drafts, n, seeds, positions)


def drafts_ignored(p, q, drafts, n, seeds, positions):  # one plain draw from p_0: right marginal, no acceptance
    return rejection_sample_reference(p, q, drafts, torch.zeros_like(n), seeds, positions)


def residual_is_p(p, q, drafts, n, seeds, positions):  # recovered tokens drawn from p, not max(0, p - q)
    k = q.shape[1]
    out = rejection_sample_reference(p, q, drafts, n, seeds, positions)
    emitted = (out >= 0).sum(dim=1)
    again = rejection_sample_reference(p, q, drafts, emitted - 1, seeds, positions)  # the bonus at the last one
    return torch.where(torch.arange(k + 1) < emitted[:, None], again, -1)


def token_in_the_last_column(*inputs):
    out = rejection_sample_reference(*inputs)
    out[:, -1] = out[:, -1].clamp(min=0)
    return out


@pytest.mark.parametrize("broken,expected", [
    (accept_all, "the number of drafts accepted"),
    (drafts_ignored, "the number of drafts accepted"),
    (residual_is_p, "the token at position 0"),
    (lambda *a: rejection_sample_reference(*a).clamp(min=0), "more than num_drafts + 1 tokens"),  # padding 0
    (token_in_the_last_column, "a value other than -1 after the first -1"),
    (lambda *a: rejection_sample_reference(*a).int(), "expected int64"),
    (lambda *a: torch.full_like(rejection_sample_reference(*a), -1), "no token emitted"),
])
def test_a_broken_sampler_fails(broken, expected):
    failures = check_rejection_sampler(broken)
    assert any(expected in f for f in failures), failures
