"""Invariance: nanovllm_ref's greedy generations must not depend on how the work is scheduled or laid out.

Each case runs the golden prompts in float32 under one engine setting and compares with the plain run (all
prompts at once, default settings): tokens exact (no divergence allowed) and logprobs within the tight
float32 bound of ``invariance_tolerance()``. Cases: one request alone / batched with 63 others, prefix cache
cold / warm, forced preemption, chunked prefill (max_num_batched_tokens=7), block size 256, and tensor
parallelism (2 ranks over gloo on the CPU). Async scheduling (on by default) launches only steps without logprobs
ahead, and the plain run asks for logprobs (every step waits for its tokens: the synchronous engine), so its case
runs the prompts without logprobs and compares the tokens: chunked prefill next to decodes, and a KV cache small
enough to preempt.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.compare import EngineOutput
from nanovllm_ref.oracle.references import Reference, run_check
from nanovllm_ref.oracle.requests import RequestSpec
from nanovllm_ref.oracle.tolerances import invariance_tolerance

from .harness import require_dtype, tolerance_for

DTYPE = "float32"


@pytest.fixture(scope="session", autouse=True)
def _nanovllm_ref_only(options) -> None:
    if options.engine != "nanovllm_ref":
        pytest.skip(f"invariance tests drive nanovllm_ref's engine settings; --engine is {options.engine}")


@pytest.fixture(scope="session")
def plain(model_spec, engines, references) -> Reference:
    """The plain run as the reference: nanovllm_ref, float32, default settings, all prompts at once."""
    ref = references.get(model_spec, DTYPE)
    outputs = engines.generate(model_spec, DTYPE, ref, tensor_parallel_size=1)
    return replace(ref, outputs=outputs, source="nanovllm_ref plain run")


def check(adapter, plain: Reference, case: str, record, outputs: list[EngineOutput] | None = None,
          prompt_logprobs: bool = True) -> None:
    report = run_check(adapter, plain, invariance_tolerance(), case=case, outputs=outputs,
                       prompt_logprobs=prompt_logprobs, allow_divergence=False)
    record(report)
    assert report.passed, "\n" + report.format_failures()


def generate(adapter, plain: Reference, prompts: list[list[int]], prompt_logprobs: bool = True) -> list:
    return adapter.generate(prompts, plain.max_tokens, plain.top_k, prompt_logprobs)


def test_alone_vs_batched(model_spec, engines, plain, record) -> None:
    adapter = engines.get(model_spec, DTYPE, tensor_parallel_size=1)
    alone = [generate(adapter, plain, [p])[0] for p in plain.prompts]
    check(adapter, plain, "alone", record, alone)
    vocab = json.loads((Path(model_spec.path) / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    fillers = [[rng.randrange(vocab) for _ in range(rng.randint(1, 200))] for _ in range(64 - len(plain.prompts))]
    batched = generate(adapter, plain, plain.prompts + fillers)[: len(plain.prompts)]
    check(adapter, plain, "batched-64", record, batched)


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_prefix_cache_cold_vs_warm(model_spec, plain, record) -> None:
    bs = 16
    adapter = NanovllmRefAdapter(model_spec.path, DTYPE, kvcache_block_size=bs, enable_prefix_caching=True)
    try:
        prompts = plain.prompts
        # phase 1: the first prompt of every group sharing >= one block; phase 2: the prompts that share with it
        first, second, expected = [], [], {}
        for i, p in enumerate(prompts):
            shared = max((min(_lcp(p, prompts[j]), len(p) - 1) // bs * bs for j in first), default=0)
            (second if shared else first).append(i)
            expected[i] = shared
        out = {}
        for phase in (first, second):
            for i, o in zip(phase, generate(adapter, plain, [prompts[i] for i in phase], prompt_logprobs=False)):
                out[i] = o
        cold = [out[i] for i in range(len(prompts))]
        check(adapter, plain, "prefix-cache cold+shared", record, cold, prompt_logprobs=False)
        for i in second:
            assert cold[i].num_cached_tokens >= expected[i] > 0, (plain.prompt_ids[i], cold[i].num_cached_tokens)
        warm = generate(adapter, plain, prompts, prompt_logprobs=False)
        check(adapter, plain, "prefix-cache warm", record, warm, prompt_logprobs=False)
        for pid, p, o in zip(plain.prompt_ids, prompts, warm):
            assert o.num_cached_tokens == (len(p) - 1) // bs * bs, (pid, len(p), o.num_cached_tokens)
        assert any(o.num_cached_tokens > 0 for o in warm)
    finally:
        adapter.close()


def test_forced_preemption(model_spec, plain, record) -> None:
    bs = 16
    longest = max(len(p) for p in plain.prompts) + plain.max_tokens
    blocks = -(-longest // bs) + 2  # room for the longest request plus a little: the others must wait or be preempted
    adapter = NanovllmRefAdapter(model_spec.path, DTYPE, kvcache_block_size=bs, num_kvcache_blocks=blocks,
                                 max_model_len=longest)
    try:
        outputs = generate(adapter, plain, plain.prompts)
        assert adapter.num_preemptions > 0, "the tiny KV cache should have forced preemptions"
        check(adapter, plain, f"preemption ({adapter.num_preemptions}x)", record, outputs)
    finally:
        adapter.close()


@pytest.mark.parametrize("setting", [{"max_num_batched_tokens": 7}, {"kvcache_block_size": 256}],
                         ids=["chunked-prefill-7", "block-size-256"])
def test_engine_setting(model_spec, plain, record, setting) -> None:
    adapter = NanovllmRefAdapter(model_spec.path, DTYPE, **setting)
    try:
        check(adapter, plain, ",".join(f"{k}={v}" for k, v in setting.items()), record)
    finally:
        adapter.close()


def test_tensor_parallel(model_spec, plain, options, record) -> None:
    tp = max(2, options.tp)
    heads = json.loads((Path(model_spec.path) / "config.json").read_text())["num_attention_heads"]
    if heads % tp:
        pytest.skip(f"{heads} attention heads do not split over {tp} ranks")
    adapter = NanovllmRefAdapter(model_spec.path, DTYPE, tensor_parallel_size=tp)
    try:
        check(adapter, plain, f"tensor-parallel-{tp}", record)
    finally:
        adapter.close()


def test_tensor_parallel_bfloat16(model_spec, options, references, record, pytestconfig) -> None:
    """TP=2 in bfloat16 (half-precision partial sums all-reduced over gloo) against the bfloat16 goldens, under the
    golden policy (the plain run is float32: bfloat16 is compared with its own reference)."""
    require_dtype(pytestconfig, "bfloat16")
    tp = max(2, options.tp)
    heads = json.loads((Path(model_spec.path) / "config.json").read_text())["num_attention_heads"]
    if heads % tp:
        pytest.skip(f"{heads} attention heads do not split over {tp} ranks")
    ref = references.get(model_spec, "bfloat16")
    adapter = NanovllmRefAdapter(model_spec.path, "bfloat16", tensor_parallel_size=tp)
    try:
        report = run_check(adapter, ref, tolerance_for("bfloat16", options, ref), case=f"tensor-parallel-{tp}-bfloat16")
    finally:
        adapter.close()
    record(report)
    assert report.passed, "\n" + report.format_failures()


def test_async_scheduling(model_spec, plain) -> None:
    """Greedy requests without logprobs (the steps async scheduling launches behind the one in flight: prefill
    chunks, mixed and decode steps, their input ids partly from the step in flight) give the plain run's tokens,
    in 7-token chunks and a KV cache so small that requests are preempted (one run: the conformance time budget).
    Every other request stops on a token of its own plain output mid-way: a row that finishes while the step
    behind it is in flight, whose token there is dropped while the other rows' are applied."""
    longest = max(len(p) for p in plain.prompts) + plain.max_tokens
    setting = dict(max_num_batched_tokens=7, kvcache_block_size=16, num_kvcache_blocks=-(-longest // 16) + 2,
                   max_model_len=longest)
    want, specs = [list(o.token_ids) for o in plain.outputs], []
    for i, (prompt, tokens) in enumerate(zip(plain.prompts, want)):
        params = {"temperature": 0.0, "max_tokens": plain.max_tokens, "ignore_eos": True}
        at = next((k for k in range(len(tokens) // 2, len(tokens)) if tokens[k] not in tokens[:k]), None)
        if i % 2 and at is not None:  # (the first occurrence of that token: the plain run ends there)
            params["stop_token_ids"] = [tokens[at]]
            want[i] = tokens[: at + 1]
        specs.append(RequestSpec(list(prompt), params))
    adapter = NanovllmRefAdapter(model_spec.path, DTYPE, async_scheduling=True, **setting)
    try:
        got = [c[0].token_ids for c in adapter.run_requests(specs)]
        assert adapter.num_preemptions > 0, "the tiny KV cache should have forced preemptions"
    finally:
        adapter.close()
    bad = [pid for pid, g, w in zip(plain.prompt_ids, got, want) if g != w]
    assert not bad, f"async scheduling, {setting}: tokens differ from the plain (synchronous) run for {bad}"
