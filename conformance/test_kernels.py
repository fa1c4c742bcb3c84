"""Kernel-level conformance: an engine's kernels against nanovllm_ref's public pure-torch references.

Each candidate of ``--kernels`` (default: nanovllm_ref's Triton kernels with ``--engine nanovllm_ref``; see
nanovllm_ref/testing/kernels.py for the registry and how an engine plugs its own in) runs on Hypothesis inputs
of nanovllm_ref.testing (paged batches with poisoned unused KV, GQA ratios, block sizes, split counts) whose
activations are scaled by 1e-3 ... 1e2, so epsilon, overflow and accumulation-dtype bugs show. On a machine
without a GPU the kernels run in the Triton interpreter at small shapes, float32 and float16 (bf16 ``tl.dot``
is broken there), a few examples each; ``pytest conformance -m gpu`` runs real shapes in bf16/fp16/fp32.
A candidate that cannot run here (no triton; no GPU and no interpreter) is skipped with its reason, listed once
per candidate at the end; a failure is a short message (kernel, inputs' shapes, magnitude, the worst element with
both values, the tolerance). A sampling kernel's candidates also go through its statistical check
(``test_kernel_statistics``: the rejection sampler's token distribution, acceptance counts and padding).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanovllm_ref.oracle.adapters import resolve_factory
from nanovllm_ref.testing.kernels import (
    FIXED_INPUTS,
    KERNELS,
    MAGNITUDES,
    STATISTICAL_CHECKS,
    KernelCandidate,
    nanovllm_ref_candidates,
)
from nanovllm_ref.testing.mismatch import KernelMismatch, describe

REFERENCE_FREE = True  # runs under --reference none

ON_GPU = torch.cuda.is_available()
SLOW = HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture


def candidates(config: pytest.Config) -> list[KernelCandidate]:
    spec = config.getoption("--kernels")
    if spec:
        return list(resolve_factory(spec)())
    return nanovllm_ref_candidates() if config.getoption("--engine") == "nanovllm_ref" else []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "candidate" in metafunc.fixturenames:
        found = candidates(metafunc.config)
        unknown = sorted({c.kernel for c in found} - set(KERNELS))
        if unknown:
            raise pytest.UsageError(f"--kernels: unknown kernel names {unknown}; known: {sorted(KERNELS)}")
        metafunc.parametrize("candidate", found, ids=[f"{c.kernel}-{c.label}" for c in found])
        metafunc.parametrize("magnitude", MAGNITUDES, ids=[f"x{m:g}" for m in MAGNITUDES])
    if "fixed_case" in metafunc.fixturenames:
        cases = [(c, name) for c in candidates(metafunc.config) for name in FIXED_INPUTS.get(c.kernel, {})]
        metafunc.parametrize("fixed_case", cases, ids=[f"{c.kernel}-{c.label}-{name}" for c, name in cases])
    if "statistical_candidate" in metafunc.fixturenames:
        found = [c for c in candidates(metafunc.config) if c.kernel in STATISTICAL_CHECKS]
        metafunc.parametrize("statistical_candidate", found, ids=[f"{c.kernel}-{c.label}" for c in found])


def skip_unavailable(candidate: KernelCandidate) -> None:
    reason = candidate.skip_reason()
    if reason:  # the same text for all of a candidate's cases: pytest's summary lists it once, with the count
        pytest.skip(f"kernel candidate {candidate.kernel} [{candidate.label}]: {reason}")


def compare(candidate: KernelCandidate, inputs, what: str) -> None:
    """The candidate against the reference on ``inputs``; a mismatch re-raised as one short message."""
    spec = KERNELS[candidate.kernel]
    try:
        spec.check(spec.call(candidate.fn, inputs), spec.call(spec.reference, inputs), inputs)
    except KernelMismatch as e:
        raise KernelMismatch(f"{candidate.kernel} [{candidate.label}] {what}, inputs {describe(inputs)}: {e}") from None


def check(candidate: KernelCandidate, magnitude: float, data: st.DataObject, size: str, dtypes) -> None:
    skip_unavailable(candidate)
    device = "cuda" if ON_GPU else "cpu"
    inputs = data.draw(KERNELS[candidate.kernel].draws(size, dtypes, magnitude, device), label="inputs")
    compare(candidate, inputs, f"magnitude x{magnitude:g}")


@settings(max_examples=12 if ON_GPU else 4, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_kernel(candidate, magnitude, data) -> None:
    check(candidate, magnitude, data, "small", (torch.float32, torch.float16))


@pytest.mark.gpu
@settings(max_examples=20, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_kernel_gpu(candidate, magnitude, data) -> None:
    check(candidate, magnitude, data, "full", (torch.float32, torch.float16, torch.bfloat16))


def test_kernel_fixed_inputs(fixed_case) -> None:
    """Each candidate on its kernel's fixed inputs (nanovllm_ref.testing.kernels.FIXED_INPUTS): shapes where every
    program axis holds data (every split of every KV head of split-K decode, a sampler's vocabulary chunks, the
    column blocks of a wide SiLU-and-mul row).
    The small Hypothesis draws above rarely reach them, so a program mapped to the wrong split could pass those."""
    candidate, name = fixed_case
    skip_unavailable(candidate)
    compare(candidate, FIXED_INPUTS[candidate.kernel][name]("cuda" if ON_GPU else "cpu"), f"fixed inputs {name}")


def test_kernel_statistics(statistical_candidate) -> None:
    """Each candidate of a sampling kernel through its statistical check (nanovllm_ref.testing.kernels.
    STATISTICAL_CHECKS; the rejection sampler's: oracle/rejection_check.py, synthetic target and draft
    distributions over thousands of seeds, family-wise false-alarm rate 1e-5): the emitted tokens' distribution
    at every position, the acceptance counts, the -1 padding. An engine with noise of its own cannot draw the
    reference's tokens (the comparisons above); this holds it to the distribution they must follow."""
    candidate = statistical_candidate
    skip_unavailable(candidate)
    failures = STATISTICAL_CHECKS[candidate.kernel](candidate.fn, "cuda" if ON_GPU else "cpu")
    assert not failures, f"{candidate.kernel} [{candidate.label}]: " + "; ".join(failures[:5])
