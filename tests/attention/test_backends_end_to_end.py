"""The sdpa and Triton attention backends run the whole engine (Triton on the CPU through the Triton interpreter)
and give the same greedy tokens as the torch reference backend, with prefix hits, chunking and decode mixed."""

from __future__ import annotations

import os

import pytest

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.attention.metadata import decode_batch_bucket
from nanovllm_ref.engine.cuda_graph import capture_sizes

from ..conftest import QWEN3, checkpoint_path

_NEEDS_INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                        reason="CPU run needs the Triton interpreter")


@pytest.mark.parametrize("backend, passes", [("sdpa", 2), pytest.param("triton", 1, marks=_NEEDS_INTERPRETER)])
def test_engine_matches_torch_backend(backend, passes):
    """The whole engine on `backend` against the torch reference backend: the same greedy tokens and logprobs
    with chunked prefill (24-token steps), prefix hits and decode mixed; a second pass starts from the warm
    prefix cache (one pass for Triton: the interpreter is slow)."""
    prompts = [[5, 6, 7], [9] * 20, [9] * 20 + [4, 4], list(range(3, 40))]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=2)
    path = str(checkpoint_path(QWEN3))
    ref = LLM(path, dtype="float32", attention_backend="torch").generate(prompts, params, use_tqdm=False)
    llm = LLM(path, dtype="float32", attention_backend=backend, max_num_batched_tokens=24, max_num_seqs=3)
    for _ in range(passes):
        out = llm.generate(prompts, params, use_tqdm=False)
        assert [o.token_ids for o in out] == [o.token_ids for o in ref]
        for a, b in zip(out, ref):
            for da, db in zip(a.logprobs, b.logprobs):
                assert max(abs(da[t] - db[t]) for t in db) < 1e-4


def test_decode_buckets_cover_every_batch_size():
    sizes = capture_sizes(100)
    for n in range(1, 101):
        bucket = decode_batch_bucket(n)
        assert bucket >= n and bucket in sizes
    assert capture_sizes(8) == [1, 2, 4, 8] and capture_sizes(600)[-1] == 512


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_silu_and_mul_kernel_matches_reference(dtype):
    import torch

    from nanovllm_ref.kernels.activation import silu_and_mul, silu_and_mul_reference

    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = (torch.randn(7, 2 * 1500, generator=torch.Generator().manual_seed(1)) * 4).to(getattr(torch, dtype)).to(device)
    out, ref = silu_and_mul(x), silu_and_mul_reference(x)
    tol = 1e-6 if dtype == "float32" else 1e-3
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


@_NEEDS_INTERPRETER
@pytest.mark.parametrize("model", [QWEN3, "qwen2-tiny", "llama3-tiny"])
def test_fused_qkv_epilogue_matches_torch_backend(monkeypatch, model):
    """The fused q/k-norm + RoPE + KV-store path (CUDA-only in the engine) forced on through the interpreter: the
    same greedy tokens and logprobs as the unfused torch backend, with q/k norm (Qwen3), qkv bias without norm
    (Qwen2) and llama3 RoPE scaling, over prefill, chunked prefill and decode."""
    import dataclasses

    import nanovllm_ref.attention.triton_backend as triton_backend
    import nanovllm_ref.config as config

    prompts = [[5, 6, 7], [9] * 20 + [4, 4], list(range(3, 40))]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=2)
    path = str(checkpoint_path(model))
    ref = LLM(path, dtype="float32", attention_backend="torch").generate(prompts, params, use_tqdm=False)
    calls = []

    resolve, fused = config.resolve_plan, triton_backend.qkv_epilogue
    monkeypatch.setattr(config, "resolve_plan", lambda *a: dataclasses.replace(resolve(*a), fused_epilogue=True))
    monkeypatch.setattr(triton_backend, "qkv_epilogue", lambda *a: calls.append(1) or fused(*a))
    llm = LLM(path, dtype="float32", attention_backend="triton", max_num_batched_tokens=24, max_num_seqs=3)
    out = llm.generate(prompts, params, use_tqdm=False)
    assert calls, "the fused path was not taken"
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    for a, b in zip(out, ref):
        for da, db in zip(a.logprobs, b.logprobs):
            assert max(abs(da[t] - db[t]) for t in db) < 1e-4
