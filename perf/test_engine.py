"""Engine benchmarks: headline throughput, prefix-heavy throughput, latency (TTFT / TPOT), TP=1 vs TP=2.

One engine lives at a time (`EnginePool` of nanovllm_ref/testing/bench/runner.py, closed at the end of this module
so the kernel benchmarks get the GPU memory back). Each round is one `generate` of the whole workload (prefix cache
emptied in the untimed setup); the warm-up happens when the engine is built. `extra_info` holds output / total
tok/s, steps, and the fraction of the roofline computed from the measured ceilings (testing/bench/roofline.py).
GPU variants use --arch (default qwen3-0.6b) or --model; the smoke variants run the tiny arch on the CPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.models import ModelShape
from nanovllm_ref.testing.bench.roofline import H200, roofline
from nanovllm_ref.testing.bench.runner import (
    EnginePool,
    ThroughputResult,
    reset_prefix_cache,
    run_latency,
    run_throughput,
)

ENGINE_ROUNDS = 3
LATENCY = {1: 10, 64: 3}  # batch -> reps per round
CPU_ENGINE = dict(arch="tiny", device="cpu", max_model_len=256, max_num_seqs=16, max_num_batched_tokens=512)


@pytest.fixture(scope="module")
def engines():
    pool = EnginePool()
    yield pool
    pool.close()


def _throughput(benchmark: Any, llm: Any, w: workloads.Workload, shape: ModelShape, ceilings: Any, rounds: int,
                tp: int = 1, dtype_bytes: int = 2, kv_dtype_bytes: int | None = None) -> ThroughputResult:
    results: list[ThroughputResult] = []
    benchmark.pedantic(lambda: results.append(run_throughput(llm, w, reset_cache=False)),
                       setup=lambda: reset_prefix_cache(llm), rounds=rounds, warmup_rounds=0)
    r = sorted(results, key=lambda x: x.wall_s)[len(results) // 2]
    prompt_lens = [len(p) for p in w.prompts]
    roof = roofline(shape, prompt_lens, w.output_lens, ceilings, tp, dtype_bytes, r.cached_prompt_tokens,
                    kv_dtype_bytes)
    roof_h200 = roofline(shape, prompt_lens, w.output_lens, H200, tp, 2, r.cached_prompt_tokens)
    benchmark.extra_info.update(
        **{k: v for k, v in r.as_dict().items() if k != "workload"}, workload=w.name, tp=tp,
        output_tok_s_all=[x.output_tok_s for x in results], roofline_s=roof.seconds,
        roofline_output_tok_s=roof.output_tok_s, roofline_fraction=roof.seconds / r.wall_s,
        roofline_h200_fraction=roof_h200.seconds / r.wall_s, copy_ceiling_gbps=ceilings.copy_gbps,
    )
    return r


def _latency(benchmark: Any, llm: Any, batch: int, prompt_len: int, output_len: int, reps: int, rounds: int) -> None:
    runs = []
    benchmark.pedantic(lambda: runs.append(run_latency(llm, batch, prompt_len, output_len, reps)),
                       rounds=rounds, warmup_rounds=0)
    merged = runs[0]
    for r in runs[1:]:
        merged.ttft_ms += r.ttft_ms
        merged.tpot_ms += r.tpot_ms
        merged.itl_ms += r.itl_ms
    merged.reps = sum(r.reps for r in runs)
    benchmark.extra_info.update(merged.summary())


# ---- GPU ----------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_headline_throughput(benchmark, engines, perf_model, shape, ceilings):
    arch, model = perf_model
    llm = engines.get(arch=arch, model=model)
    benchmark.group = "engine_throughput"
    _throughput(benchmark, llm, workloads.headline(), shape, ceilings, ENGINE_ROUNDS)


@pytest.mark.gpu
def test_headline_throughput_fp8_kv(benchmark, engines, perf_model, shape, ceilings):
    """The headline with an FP8 (e4m3) KV cache: half the KV bytes per decode step; roofline with 1-byte KV."""
    arch, model = perf_model
    llm = engines.get(arch=arch, model=model, kv_cache_dtype="fp8")
    benchmark.group = "engine_throughput"
    _throughput(benchmark, llm, workloads.headline(), shape, ceilings, ENGINE_ROUNDS, kv_dtype_bytes=1)


@pytest.mark.gpu
def test_headline_throughput_batch_invariant(benchmark, engines, perf_model, shape, ceilings):
    """The headline in batch_invariant mode (one-tile GEMMs, one attention tile, kernels/matmul.py): its own case, so
    the gate tracks the mode's cost apart from the default's."""
    arch, model = perf_model
    llm = engines.get(arch=arch, model=model, batch_invariant=True)
    benchmark.group = "engine_throughput"
    _throughput(benchmark, llm, workloads.headline(), shape, ceilings, ENGINE_ROUNDS)


@pytest.mark.gpu
def test_prefix_heavy_throughput(benchmark, engines, perf_model, shape, ceilings):
    arch, model = perf_model
    llm = engines.get(arch=arch, model=model)
    benchmark.group = "engine_throughput"
    w = workloads.prefix_heavy()
    r = _throughput(benchmark, llm, w, shape, ceilings, ENGINE_ROUNDS)
    # requests admitted in the first step compute the prefix themselves; all later ones hit the cache
    assert r.cached_prompt_tokens >= w.num_requests * 1024 // 2, "the shared prefix should be served cached"


@pytest.mark.gpu
@pytest.mark.parametrize("batch", sorted(LATENCY))
def test_latency(benchmark, engines, perf_model, batch):
    arch, model = perf_model
    llm = engines.get(arch=arch, model=model)
    benchmark.group = "engine_latency"
    _latency(benchmark, llm, batch, prompt_len=512, output_len=128, reps=LATENCY[batch], rounds=3)


@pytest.mark.gpu
@pytest.mark.parametrize("tp", [1, 2])
def test_tp_scaling(benchmark, engines, perf_model, shape, ceilings, tp):
    if tp > torch.cuda.device_count():
        pytest.skip(f"TP={tp} needs {tp} GPUs, {torch.cuda.device_count()} present")
    arch, model = perf_model
    llm = engines.get(arch=arch, model=model, tp=tp)
    benchmark.group = "engine_tp"
    # the first 128 headline requests, the TP workload of perf/RESULTS.md (the 8B shape at 256 sequences is KV-bound)
    _throughput(benchmark, llm, workloads.headline().subset(128), shape, ceilings, 2, tp=tp)


SPECULATIVE = {  # draft model -> what it measures (speculative_config with 3 drafts a step)
    "target": "every draft accepted (draft = target): the tokens per step and the verify step's cost",
    "draft": "every draft rejected (a 2-layer model of random weights): the overhead of a wasted speculation",
}


def _speculative_case(benchmark: Any, llm: Any, batch: int, lengths: tuple[int, int], rounds: int) -> None:
    _latency(benchmark, llm, batch, *lengths, reps=rounds, rounds=rounds)
    stats = llm.stats().spec_decoding
    if stats is not None:
        benchmark.extra_info.update(acceptance_rate=stats.acceptance_rate,
                                    mean_acceptance_length=stats.mean_acceptance_length)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("case", ["plain", *SPECULATIVE])
def test_speculative_latency(benchmark, engines, perf_model, case, batch):
    """TPOT of a draft-model speculative engine against the plain one (SPECULATIVE says what each case measures);
    graphs stay on for the steps that verify nothing. The KV budget leaves room for the draft's cache."""
    arch, _ = perf_model
    llm = engines.get(arch=arch, speculative_config=_draft(arch, case, "qwen3-0.6b-draft"), gpu_memory_utilization=0.4)
    benchmark.group = f"engine_speculative_batch{batch}"
    _speculative_case(benchmark, llm, batch, (512, 128), 2)


def _draft(arch: str, case: str, other: str) -> dict | None:
    from nanovllm_ref.testing.bench.models import model_folder

    return None if case == "plain" else {"model": model_folder(arch if case == "target" else other),
                                         "num_speculative_tokens": 3}


# ---- CPU smoke ----------------------------------------------------------------------------------------------
TINY = ModelShape.from_arch("tiny")


@pytest.mark.smoke
def test_headline_throughput_smoke(benchmark, engines, ceilings):
    llm = engines.get(**CPU_ENGINE)
    benchmark.group = "smoke-engine_throughput"
    w = workloads.smoke()
    r = _throughput(benchmark, llm, w, TINY, ceilings, 1, dtype_bytes=4)
    assert r.output_tokens == w.output_tokens and r.steps >= max(w.output_lens)
    assert 0 < benchmark.extra_info["roofline_fraction"]


@pytest.mark.smoke
def test_prefix_heavy_smoke(benchmark, engines, ceilings):
    llm = engines.get(**CPU_ENGINE)
    benchmark.group = "smoke-engine_throughput"
    w = workloads.get("prefix-smoke")
    r = _throughput(benchmark, llm, w, TINY, ceilings, 1, dtype_bytes=4)
    assert r.cached_prompt_tokens > 0  # requests admitted after the first step hit the 64-token shared prefix


@pytest.mark.smoke
@pytest.mark.parametrize("case", ["plain", *SPECULATIVE])
def test_speculative_latency_smoke(benchmark, engines, case):
    llm = engines.get(**CPU_ENGINE, speculative_config=_draft("tiny", case, "tiny-draft"))
    benchmark.group = "smoke-engine_speculative"
    _speculative_case(benchmark, llm, 2, (16, 8), 1)
    rate = benchmark.extra_info.get("acceptance_rate")
    assert rate is None if case == "plain" else (rate == 1.0 if case == "target" else rate < 0.5)


@pytest.mark.smoke
@pytest.mark.parametrize("batch", [1, 4])
def test_latency_smoke(benchmark, engines, batch):
    llm = engines.get(**CPU_ENGINE)
    benchmark.group = "smoke-engine_latency"
    _latency(benchmark, llm, batch, prompt_len=16, output_len=4, reps=1, rounds=1)
    info = benchmark.extra_info
    assert info["reps"] == 1 and info["ttft_p50_ms"] > 0 and info["tpot_p50_ms"] > 0
    assert info["ttft_p50_ms"] <= info["ttft_p99_ms"] and info["tpot_p50_ms"] <= info["tpot_p99_ms"]
