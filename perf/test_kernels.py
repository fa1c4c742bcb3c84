"""Kernel benchmarks: store_kv, paged decode attention, varlen prefill attention, fused add + RMSNorm, sampler.

GPU variants (`gpu` marker) time the Triton kernels at the model's shapes (--arch, default Qwen3-0.6B: 16 query
heads, 8 KV heads, head_dim 128, hidden 1024; bf16, KV block size 16); `extra_info` holds CUDA-event time per
call, GB/s or TFLOP/s, and the fraction of the measured copy / matmul ceiling (perf/kernel_bench.py).
The `smoke` variants run the pure-torch references at toy sizes on the CPU (they check the harness, not speed).
`NANOVLLM_REF_SLOW_KERNELS=1` slows the decode kernel on purpose: perf/gate_demo.sh shows the gate tripping.
"""

from __future__ import annotations

import gc

import pytest
import torch

from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.models import ModelShape
from perf import kernel_bench as kb

GPU_ROUNDS, GPU_WARMUP, GPU_EVENT_REPS = 30, 5, 20
CPU_ROUNDS, CPU_WARMUP, CPU_EVENT_REPS = 3, 1, 3
TINY = ModelShape.from_arch("tiny")


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _gpu(benchmark, case: kb.Case, ceilings, group: str) -> None:
    benchmark.group = group
    kb.run_case(benchmark, case, "cuda", ceilings, GPU_ROUNDS, GPU_WARMUP, GPU_EVENT_REPS)


def _cpu(benchmark, case: kb.Case, ceilings, group: str) -> None:
    benchmark.group = f"smoke-{group}"
    kb.run_case(benchmark, case, "cpu", ceilings, CPU_ROUNDS, CPU_WARMUP, CPU_EVENT_REPS)


# ---- GPU ----------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [256, 8192, 16384])  # 16384: a full prefill step of the headline config
def test_store_kv(benchmark, ceilings, shape, num_tokens):
    _gpu(benchmark, kb.store_kv_case(shape, num_tokens, "cuda", torch.bfloat16), ceilings, "store_kv")


@pytest.mark.gpu
def test_store_kv_scattered(benchmark, ceilings, shape):
    """Every token in a random slot: no two tokens share a block (worst case; the engine fills whole blocks)."""
    _gpu(benchmark, kb.store_kv_case(shape, 16384, "cuda", torch.bfloat16, scattered=True), ceilings, "store_kv")


@pytest.mark.gpu
@pytest.mark.parametrize("ctx", [2048, 4096])
@pytest.mark.parametrize("batch", [64, 256])
def test_decode_attention(benchmark, ceilings, shape, batch, ctx):
    _gpu(benchmark, kb.decode_case(shape, batch, ctx, "cuda", torch.bfloat16), ceilings, "decode_attention")


@pytest.mark.gpu
@pytest.mark.parametrize("step", [0, 640])  # 256 sequences of 108-1,025 tokens; 90 of 761-1,659
def test_decode_attention_headline(benchmark, ceilings, shape, step):
    """Mixed contexts (the headline's decode step `step`), where the grid order and the longest-first order
    matter; the uniform cases above do not see them (perf/RESULTS.md, "Kernels")."""
    contexts = workloads.decode_contexts(workloads.headline(), step)
    case = kb.decode_mixed_case(shape, contexts, "cuda", torch.bfloat16, name=f"decode-headline-step{step}")
    _gpu(benchmark, case, ceilings, "decode_attention")


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs,q_len", [(8, 1024), (2, 4096), (16, 512)])
def test_prefill_attention(benchmark, ceilings, shape, num_seqs, q_len):
    case = kb.prefill_case(shape, num_seqs, q_len, "cuda", torch.bfloat16)
    _gpu(benchmark, case, ceilings, "prefill_attention")


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [256, 8192])
def test_rmsnorm(benchmark, ceilings, shape, num_tokens):
    _gpu(benchmark, kb.rmsnorm_case(num_tokens, shape.hidden_size, "cuda", torch.bfloat16), ceilings, "rmsnorm")


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.6])
@pytest.mark.parametrize("batch", [64, 256])
def test_sampler(benchmark, ceilings, shape, batch, temperature):
    _gpu(benchmark, kb.sampler_case(batch, shape.vocab_size, temperature, "cuda", torch.bfloat16), ceilings, "sampler")


# ---- CPU smoke ----------------------------------------------------------------------------------------------
@pytest.mark.smoke
def test_store_kv_smoke(benchmark, ceilings):
    _cpu(benchmark, kb.store_kv_case(TINY, 64, "cpu", torch.float32), ceilings, "store_kv")


@pytest.mark.smoke
def test_decode_attention_smoke(benchmark, ceilings):
    info = kb.run_case(benchmark, kb.decode_case(TINY, 4, 64, "cpu", torch.float32), "cpu", ceilings,
                       CPU_ROUNDS, CPU_WARMUP, CPU_EVENT_REPS)
    assert info["gbps"] > 0 and info["calls_per_round"] == 1


@pytest.mark.smoke
def test_decode_attention_mixed_smoke(benchmark, ceilings):
    contexts = workloads.decode_contexts(workloads.smoke(), 2)
    info = kb.run_case(benchmark, kb.decode_mixed_case(TINY, contexts, "cpu", torch.float32, max_model_len=64), "cpu",
                       ceilings, CPU_ROUNDS, CPU_WARMUP, CPU_EVENT_REPS)
    assert info["gbps"] > 0 and info["bytes_per_call"] > 0


@pytest.mark.smoke
def test_prefill_attention_smoke(benchmark, ceilings):
    info = kb.run_case(benchmark, kb.prefill_case(TINY, 2, 32, "cpu", torch.float32), "cpu", ceilings,
                       CPU_ROUNDS, CPU_WARMUP, CPU_EVENT_REPS)
    assert info["tflops"] > 0 and 0 < info["fraction_of_ceiling"]


@pytest.mark.smoke
def test_rmsnorm_smoke(benchmark, ceilings):
    _cpu(benchmark, kb.rmsnorm_case(32, 64, "cpu", torch.float32), ceilings, "rmsnorm")


@pytest.mark.smoke
@pytest.mark.parametrize("temperature", [0.0, 0.6])
def test_sampler_smoke(benchmark, ceilings, temperature):
    _cpu(benchmark, kb.sampler_case(8, 1024, temperature, "cpu", torch.float32), ceilings, "sampler")


def test_rotating_sets_defeat_l2():
    """A small input set is replicated to >= 4 sets and >= 256 MiB on the GPU; a large one is used alone."""
    assert kb.num_sets(2 * 2**20, "cuda") == 128
    assert kb.num_sets(100 * 2**20, "cuda") == 4
    assert kb.num_sets(200 * 2**20, "cuda") == 1
    assert kb.num_sets(2 * 2**20, "cpu") == 1
