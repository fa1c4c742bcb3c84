"""Kernel-level conformance: an engine's kernels against nanovllm_ref's public pure-torch references.

Each candidate of ``--kernels`` (default: nanovllm_ref's Triton kernels with ``--engine nanovllm_ref``; see
nanovllm_ref/testing/kernels.py for the registry and how an engine plugs its own in) runs on Hypothesis inputs
of nanovllm_ref.testing (paged batches with poisoned unused KV, GQA ratios, block sizes, split counts) whose
activations are scaled by 1e-3 ... 1e2, so epsilon, overflow and accumulation-dtype bugs show. On a machine
without a GPU the kernels run in the Triton interpreter at small shapes, float32 and float16 (bf16 ``tl.dot``
is broken there), a few examples each; ``pytest conformance -m gpu`` runs real shapes in bf16/fp16/fp32.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanovllm_ref.oracle.adapters import resolve_factory
from nanovllm_ref.testing.kernels import KERNELS, MAGNITUDES, KernelCandidate, nanovllm_ref_candidates
from nanovllm_ref.testing.strategies import make_paged_batch

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
    if "decode_candidate" in metafunc.fixturenames:
        found = [c for c in candidates(metafunc.config) if c.kernel == "decode_attention"]
        metafunc.parametrize("decode_candidate", found, ids=[c.label for c in found])


def check(candidate: KernelCandidate, magnitude: float, data: st.DataObject, size: str, dtypes) -> None:
    spec = KERNELS[candidate.kernel]
    device = "cuda" if ON_GPU else "cpu"
    inputs = data.draw(spec.inputs(size, dtypes, magnitude, device), label="inputs")
    spec.check(spec.call(candidate.fn, inputs), spec.call(spec.reference, inputs), inputs)


@settings(max_examples=12 if ON_GPU else 4, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_kernel(candidate, magnitude, data) -> None:
    check(candidate, magnitude, data, "small", (torch.float32, torch.float16))


@pytest.mark.gpu
@settings(max_examples=20, deadline=None, suppress_health_check=SLOW)
@given(data=st.data())
def test_kernel_gpu(candidate, magnitude, data) -> None:
    check(candidate, magnitude, data, "full", (torch.float32, torch.float16, torch.bfloat16))


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16], ids=["float32", "float16"])
def test_decode_every_split_of_every_kv_head(decode_candidate, kv_dtype) -> None:
    """One fixed batch whose contexts fill every split of a split-K decode kernel for each of 3 KV heads (GQA 2).
    The small Hypothesis draws above rarely have a context longer than one 64-key tile with more than one KV head,
    so a kernel that maps a program to the wrong (head, split) could pass them."""
    spec = KERNELS["decode_attention"]
    batch = make_paged_batch([300, 1, 257, 130, 64], [1] * 5, num_kv_heads=3, group=2, head_dim=32, block_size=16,
                             dtype=kv_dtype, device="cuda" if ON_GPU else "cpu", seed=7, poison="nan")
    spec.check(spec.call(decode_candidate.fn, batch), spec.call(spec.reference, batch), batch)
