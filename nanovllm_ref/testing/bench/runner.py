"""Drive nanovllm_ref for benchmarks: build an engine, warm it up, time a workload, measure latencies.

Throughput is timed as nano-vllm's bench.py does: one `llm.generate(...)` call after a warm-up, wall time
from just before the call to just after it (with a device synchronize at both ends); output tok/s = the
output tokens generated / that time. Steps are counted by wrapping the engine's `step`.

Latency uses the step API: requests are added at t0, and after every `llm.step()` (plus a synchronize) each
request's output count is read, giving the arrival time of every token: TTFT = first token - t0, TPOT =
(last token - first token) / (tokens - 1) per request, ITL = gaps between consecutive tokens.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.sampling_params import RequestOutputKind

from .device import has_cuda, percentile, sync
from .models import load_format, model_folder
from .workloads import Workload, uniform


def build_llm(
    arch: str = "qwen3-0.6b", model: str | None = None, device: str | None = None, tp: int = 1,
    enforce_eager: bool = False, max_model_len: int = 4096, max_num_seqs: int = 256,
    max_num_batched_tokens: int = 16384, gpu_memory_utilization: float = 0.9, **extra: Any,
) -> LLM:
    """An engine for `arch` (random weights) or the checkpoint `model`; bf16 on the GPU, fp32 on the CPU."""
    device = device or ("cuda" if has_cuda() else "cpu")
    kwargs: dict[str, Any] = dict(
        load_format=load_format(model), device=device, dtype="bfloat16" if device == "cuda" else "float32",
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        enforce_eager=enforce_eager, tensor_parallel_size=tp,
    )
    if device == "cuda":
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    else:
        kwargs["kv_cache_memory_gb"] = 0.25
    kwargs.update(extra)
    return LLM(model_folder(arch, model), **kwargs)


PENALTIES = dict(repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)


def params_for(workload: Workload) -> list[SamplingParams]:
    """Request i takes PENALTIES when floor((i + 1) f) > floor(i f), f = the workload's penalized fraction."""
    f = float(workload.notes.get("penalized_fraction", 0.0))
    return [SamplingParams(temperature=workload.temperature, max_tokens=n, ignore_eos=True,
                           output_kind=RequestOutputKind.FINAL_ONLY,  # (the step API too: no per-step outputs)
                           **(PENALTIES if int((i + 1) * f) > int(i * f) else {}))
            for i, n in enumerate(workload.output_lens)]


def warmup(llm: LLM, max_prompt: int = 1024, max_tokens: int = 8) -> None:
    """Requests of assorted lengths (distinct from any workload's prompts). Each length first alone, so the
    prefill kernel compiles every tile variant (its BLOCK_Q follows the batch's longest query, a power of
    two), then all together for batched prefill, decode and both samplers. With CUDA graphs every decode
    batch size was already compiled at capture; under --enforce-eager the decode kernel's split count follows
    the batch and context, so some variants may still compile in the first timed run (see --full-warmup)."""
    lengths = [n for n in (1, 2, 3, 5, 9, 17, 33, 65, 129, 257, 513, 1024) if n <= max_prompt] or [max_prompt]
    prompts = [[(7 * i + j) % 997 + 1 for j in range(n)] for i, n in enumerate(lengths)]
    for p in prompts:
        llm.generate([p], SamplingParams(temperature=0.6, max_tokens=2, ignore_eos=True), use_tqdm=False)
    llm.generate(prompts, SamplingParams(temperature=0.6, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    llm.generate(prompts[-1:], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    sync(_device(llm))
    reset_prefix_cache(llm)


def _device(llm: LLM) -> str:
    return getattr(getattr(llm.engine, "spec", None), "device", "cuda" if has_cuda() else "cpu")


def reset_prefix_cache(llm: LLM) -> None:
    """Forget cached prefixes so a repeated workload computes its prompts again (fresh-engine conditions).

    Uses `llm.reset_prefix_cache()` when the engine has one; else clears the block manager's hash table
    (only safe with no request running, which is when this is called)."""
    method = getattr(llm, "reset_prefix_cache", None) or getattr(llm.engine, "reset_prefix_cache", None)
    if callable(method):
        method()
        return
    bm = llm.engine.block_manager
    if llm.has_unfinished():
        raise RuntimeError("reset_prefix_cache needs an idle engine")
    bm.cached.clear()
    for block in bm.blocks:
        if block.ref_count == 0:
            block.hash, block.parent_hash, block.token_ids = None, 0, ()


@dataclass
class ThroughputResult:
    workload: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    wall_s: float
    steps: int
    cached_prompt_tokens: int
    preemptions: int

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def total_tok_s(self) -> float:
        return (self.output_tokens + self.prompt_tokens) / self.wall_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "output_tok_s": self.output_tok_s, "total_tok_s": self.total_tok_s,
                "ms_per_step": 1e3 * self.wall_s / max(self.steps, 1)}


def _count_steps(llm: LLM) -> tuple[list[int], Callable[[], None]]:
    engine, counter = llm.engine, [0]
    original = engine.step

    def step() -> list:
        counter[0] += 1
        return original()

    engine.step = step  # instance attribute shadows the method; `restore` removes it
    return counter, lambda: engine.__dict__.pop("step", None)


def run_throughput(llm: LLM, workload: Workload, reset_cache: bool = True) -> ThroughputResult:
    """Time one `generate` of the whole workload (the caller warms the engine up first)."""
    if reset_cache:
        reset_prefix_cache(llm)
    scheduler = llm.engine.scheduler
    preempt0 = getattr(scheduler, "num_preemptions", 0)
    params = params_for(workload)
    counter, restore = _count_steps(llm)
    device = _device(llm)
    try:
        sync(device)
        t0 = time.perf_counter()
        outputs = llm.generate(workload.prompts, params, use_tqdm=False)
        sync(device)
        wall = time.perf_counter() - t0
    finally:
        restore()
    produced = sum(len(o.token_ids) for o in outputs)
    if produced != workload.output_tokens:
        errors = [o.error for o in outputs if o.error]
        raise RuntimeError(f"expected {workload.output_tokens} output tokens, got {produced} (errors: {errors[:3]})")
    return ThroughputResult(
        workload=workload.name, requests=workload.num_requests, prompt_tokens=workload.prompt_tokens,
        output_tokens=produced, wall_s=wall, steps=counter[0],
        cached_prompt_tokens=sum(o.num_cached_tokens for o in outputs),
        preemptions=getattr(scheduler, "num_preemptions", 0) - preempt0,
    )


@dataclass
class LatencyResult:
    batch: int
    prompt_len: int
    output_len: int
    reps: int
    ttft_ms: list[float]
    tpot_ms: list[float]
    itl_ms: list[float]

    def summary(self) -> dict[str, float]:
        out: dict[str, float] = {"batch": self.batch, "prompt_len": self.prompt_len, "output_len": self.output_len,
                                 "reps": self.reps}
        for name, values in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("itl", self.itl_ms)):
            out[f"{name}_p50_ms"] = percentile(values, 50)
            out[f"{name}_p99_ms"] = percentile(values, 99)
            out[f"{name}_mean_ms"] = sum(values) / len(values) if values else float("nan")
        return out


def _output_count(llm: LLM, request_id: str) -> int:
    seq = llm.engine.requests.get(request_id)  # running or waiting requests; finished ones are popped
    return 0 if seq is None else seq.num_output_tokens


def run_latency(
    llm: LLM, batch: int, prompt_len: int = 512, output_len: int = 128, reps: int = 3, temperature: float = 0.0,
    seed: int = 100,
) -> LatencyResult:
    """TTFT / TPOT / ITL of `batch` requests added at once, `reps` times (fresh prompts, empty prefix cache)."""
    device = _device(llm)
    result = LatencyResult(batch, prompt_len, output_len, reps, [], [], [])
    # FINAL_ONLY: the engine builds no per-step outputs, so the times are the engine's; tokens are counted below
    params = SamplingParams(temperature=temperature, max_tokens=output_len, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    for rep in range(reps):
        prompts = uniform(batch, prompt_len, output_len, seed=seed + rep).prompts
        reset_prefix_cache(llm)
        sync(device)
        t0 = time.perf_counter()
        ids = [llm.add_request(p, params) for p in prompts]
        arrivals: dict[str, list[float]] = {rid: [] for rid in ids}
        while llm.has_unfinished():
            finished = {o.request_id: len(o.token_ids) for o in llm.step()}
            sync(device)
            now = time.perf_counter()
            for rid, times in arrivals.items():
                count = finished.get(rid, _output_count(llm, rid)) if len(times) < output_len else output_len
                times.extend([now] * (count - len(times)))
        for times in arrivals.values():
            result.ttft_ms.append(1e3 * (times[0] - t0))
            if len(times) > 1:
                result.tpot_ms.append(1e3 * (times[-1] - times[0]) / (len(times) - 1))
                result.itl_ms.extend(1e3 * (b - a) for a, b in zip(times, times[1:]) if b > a)
    return result


class EnginePool:
    """Keeps one engine alive at a time (a GPU holds one engine's KV cache); a new config closes the old."""

    def __init__(self, warm: bool = True) -> None:
        self.key: tuple | None = None
        self.llm: LLM | None = None
        self.warm = warm

    def get(self, **kwargs: Any) -> LLM:
        kwargs.setdefault("tp", 1)
        key = tuple(sorted(kwargs.items()))
        if key != self.key:
            self.close()
            self.llm = build_llm(**kwargs)
            self.key = key
            if self.warm:
                warmup(self.llm, max_prompt=min(1024, kwargs.get("max_model_len", 4096) // 2))
        assert self.llm is not None
        return self.llm

    def close(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm, self.key = None, None
        gc.collect()
        if has_cuda():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
