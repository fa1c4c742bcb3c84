"""Structured outputs on the CPU: the per-step cost of constrained decoding against plain decoding, same batch.

`test_decode_steps[plain|structured]`: golden qwen3-tiny in float32, one torch thread, 8 greedy requests of 16-token
prompts; the round is DECODE_STEPS steady decode steps (`LLMEngine.step`, prefill done in the untimed setup). The
structured variant constrains every request with a regex that cannot end within the round (`[a-z]{64}`: the grammar
has work every step, no request ends), so the difference between the two medians (one group, side by side) is what a
constrained step costs: the bitmask built on the host from the matchers (structured/manager.py), its application
(kernels/token_bitmask.py), and the processing path the structured rows take. `extra_info` has the us per step and,
for the structured variant, the bitmask build's and application's share of it. Small enough for CI's
benchmark-disabled run (one round of a few steps).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from golden.load import checkpoint_path
from nanovllm_ref import LLM, SamplingParams, StructuredOutputsParams

pytest.importorskip("xgrammar")

NUM_REQUESTS, PROMPT_LEN, DECODE_STEPS = 8, 16, 16
REGEX = "[a-z]{64}"  # (longer than every round: the grammar never ends while timed)


@pytest.fixture(scope="module")
def llm():
    with LLM(checkpoint_path("qwen3-tiny"), dtype="float32", device="cpu", cpu_threads=1, max_model_len=512) as llm:
        yield llm


def _timed(obj: Any, name: str, spent: list[float]) -> None:
    """Wrap obj.name so that its calls' time adds to spent[0]."""
    fn = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    setattr(obj, name, wrapper)


@pytest.mark.parametrize("kind", ["plain", "structured"])
def test_decode_steps(benchmark, llm, kind):
    so = StructuredOutputsParams(regex=REGEX) if kind == "structured" else None
    params = SamplingParams(temperature=0, max_tokens=DECODE_STEPS * 4, ignore_eos=True, structured_outputs=so)
    prompts = [[(7 * i + j) % 1000 + 3 for j in range(PROMPT_LEN)] for i in range(NUM_REQUESTS)]
    engine = llm.engine
    build, apply = [0.0], [0.0]
    _timed(engine.structured, "bitmask", build)
    _timed(engine.runner, "_apply_bitmask", apply)

    def setup() -> tuple[tuple, dict]:
        for rid in list(engine.requests):
            engine.abort_request(rid)
        for p in prompts:
            engine.add_request(p, params)
        engine.step()  # the prefill (every prompt in one step)
        build[0] = apply[0] = 0.0
        return (), {}

    def decode() -> int:
        for _ in range(DECODE_STEPS):
            engine.step()
        return engine.stats().num_running

    benchmark.group = "structured_outputs"
    try:
        running = benchmark.pedantic(decode, setup=setup, rounds=5, warmup_rounds=1, iterations=1)
    finally:
        del engine.structured.bitmask, engine.runner._apply_bitmask  # (the instance attributes: the methods again)
        for rid in list(engine.requests):
            engine.abort_request(rid)
    assert running == NUM_REQUESTS  # nobody finished while timed: every step had the whole batch
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    info: dict[str, Any] = {"requests": NUM_REQUESTS, "steps": DECODE_STEPS, "kind": kind}
    if stats is not None:
        info["us_per_step"] = stats.median / DECODE_STEPS * 1e6
    if kind == "structured":  # (the last round's)
        info.update(bitmask_build_us_per_step=build[0] / DECODE_STEPS * 1e6,
                    bitmask_apply_us_per_step=apply[0] / DECODE_STEPS * 1e6)
        assert build[0] > 0 and apply[0] > 0
    benchmark.extra_info.update(info)
