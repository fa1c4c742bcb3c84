"""The batch-invariance module's prefix-cache cases test what their names say, on a stand-in engine with a prefix
cache of whole blocks whose logprobs move by one float32 ulp-sized step when a prompt is served from its cache.

* Without a shared prefix, the needle's run alone must not leave its own prompt blocks to serve it in the batch:
  otherwise an engine invariant to the batch but not to a cache hit fails a case that blames the batch.
* With a shared prefix, the needle must really be served from the cache; an engine whose block is longer than the
  shared prefix caches nothing, and the case must say so instead of passing on two uncached runs.
"""

from __future__ import annotations

import pytest

from conformance.test_batch_invariance import prefix_block, run_case
from golden.load import checkpoint_path
from nanovllm_ref.oracle.compare import EngineOutput
from nanovllm_ref.oracle.references import Reference

CACHE_HIT_SHIFT = 1e-6  # what a cache hit does to every logprob of the stand-in (a different reduction order)


class BlockCacheEngine:
    """Greedy outputs that depend only on the prompt, except that a prompt served from the prefix cache (whole
    ``block``-token blocks, registered after each run) gets logprobs shifted by CACHE_HIT_SHIFT."""

    name = "block-cache-standin"

    def __init__(self, block: int, resettable: bool = True) -> None:
        self.block, self.cached = block, set()
        if resettable:
            self.reset_prefix_cache = self.cached.clear

    def hit(self, prompt: list[int]) -> int:
        n = 0
        while n + self.block <= len(prompt) - 1 and tuple(prompt[:n + self.block]) in self.cached:
            n += self.block
        return n

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        outs = []
        for p in prompts:
            hit = self.hit(p)
            shift = CACHE_HIT_SHIFT if hit else 0.0
            tokens = [(sum(p) + s) % 97 for s in range(max_tokens)]
            steps = [{t: -0.5 - shift, t + 1: -1.5 - shift} for t in tokens]
            outs.append(EngineOutput(tokens, steps, None, hit))
        for p in prompts:
            self.cached.update(tuple(p[:n]) for n in range(self.block, len(p) + 1, self.block))
        return outs


def reference() -> Reference:
    needles = [[5], list(range(1, 301))]  # the module's needles: the first and the longest prompt
    return Reference("qwen3-tiny", checkpoint_path("qwen3-tiny"), "float32", needles, ["single", "long_300"],
                     [EngineOutput([], [], None)] * 2, max_tokens=4, top_k=2)


def run(engine: BlockCacheEngine, prefix_cache: bool) -> None:
    run_case(engine, reference(), "float32", "exact", 2, lambda report: None, "greedy", prefix_cache, sizes=(2, 3))


def test_no_prefix_case_is_not_served_by_the_needles_own_earlier_run() -> None:
    run(BlockCacheEngine(block=16), prefix_cache=False)


def test_the_stand_in_fails_where_its_cache_serves_the_needle() -> None:
    """The stand-in is sharp: an engine the module cannot empty serves the needle from its own earlier run."""
    with pytest.raises(AssertionError, match=r"greedy, trial 0: batch of \d+, needle at \d+, 288 cached tokens"):
        run(BlockCacheEngine(block=16, resettable=False), prefix_cache=False)


def test_cached_prefix_case_catches_a_cache_hit_that_moves_logprobs() -> None:
    with pytest.raises(AssertionError, match=r"(?s)first 32 tokens \(cached\), 32 cached tokens.*> tol 0"):
        run(BlockCacheEngine(block=16), prefix_cache=True)


def test_cached_prefix_case_fails_when_the_engine_cached_nothing() -> None:
    with pytest.raises(AssertionError, match=r"served 0 of the needle's 32 shared prefix tokens.*no cache hit"):
        run(BlockCacheEngine(block=64), prefix_cache=True)


def test_vllm_gets_blocks_that_hold_the_shared_prefix_unless_its_engine_args_say_otherwise() -> None:
    from types import SimpleNamespace

    assert prefix_block(SimpleNamespace(engine="vllm", engine_args=())) == {"block_size": 32}
    assert prefix_block(SimpleNamespace(engine="vllm", engine_args=(("block_size", 64),))) == {}
    assert prefix_block(SimpleNamespace(engine="nanovllm_ref", engine_args=())) == {}
