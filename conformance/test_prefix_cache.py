"""Prefix-cache accounting: the cached prompt tokens an engine reports against what a scripted workload must hit.

An engine is built with a small cache (BLOCKS usable blocks of BLOCK_SIZE tokens, prefix caching on) and runs
SCRIPT one request at a time. Prompts are made of whole blocks of segments (A: 4 blocks, B: 4, C: 6, D: 2) and one
token of their own, and each request generates BLOCK_SIZE greedy tokens, so its last block fills up too: every
block a request leaves behind is full and cached, and no policy for partial blocks can change what follows. What
must hit follows from the cache policy of vLLM's automatic prefix caching (and nanovllm_ref's): a freed block stays
cached until it is reused; free blocks are reused least recently freed first, and a request's blocks are freed tail
first (its last block is evicted before its first, so a prefix outlives its suffix); a hit is the longest run of
cached leading blocks, leaving at least one prompt token to compute. The expected counts (EXPECTED) follow from
that policy step by step, as the comments of SCRIPT trace. A request with prompt logprobs then hits nothing (every
prompt position must be computed). Then two fresh prompts that cannot both fit run together, forcing a preemption:
their cached tokens are those of their first admission (0), not of a recompute.

What the engine reports: ``Completion.num_cached_tokens`` (vLLM's ``RequestOutput.num_cached_tokens``; servers:
``usage.prompt_tokens_details.cached_tokens``). An engine that reports none, or whose adapter cannot size its
cache (``prefix_cache_kwargs``, oracle/requests.py), is skipped with the reason.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nanovllm_ref.oracle.adapters import resolve_factory
from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting, supports_requests

from .harness import selected_models

BLOCK_SIZE, BLOCKS = 32, 11  # 32: vLLM's CPU attention takes multiples of 32 only
SEGMENTS = {"A": 4, "B": 4, "C": 6, "D": 2}  # name -> blocks
# (segments of the prompt, expected cached blocks). A request holds its segment's blocks and one more (its own token
# and outputs: "x"). The free queue after each request, least recently freed first ("_": never used):
SCRIPT = (
    ("A", 0),   # _ _ _ _ _ _ xA A3 A2 A1 A0
    ("B", 0),   # _ xA A3 A2 A1 A0 xB B3 B2 B1 B0
    ("A", 4),   # A0-A3 hit, + the last never-used block: xA xB B3 B2 B1 B0 xA A3 A2 A1 A0
    ("C", 0),   # 7 blocks evict xA xB B3 B2 B1 B0 xA (all of B, none of A): A3 A2 A1 A0 xC C5 .. C0
    ("A", 4),   # A kept; evicts xC: C5 .. C0 xA A3 A2 A1 A0
    ("C", 6),   # C kept; evicts xA: A3 A2 A1 A0 xC C5 .. C0
    ("D", 0),   # 3 blocks evict A3 A2 A1 (A's tail, not its head): A0 xC C5 .. C0 xD D1 D0
    ("A", 1),   # A0 hits; evicts xC C5 C4 C3: C2 C1 C0 xD D1 D0 xA A3 A2 A1 A0
    ("C", 3),   # C0-C2 hit (C's tail was evicted, its head kept)
)
EXPECTED = [blocks * BLOCK_SIZE for _, blocks in SCRIPT]  # cached prompt tokens
PREEMPT_PROMPT_BLOCKS, PREEMPT_OUTPUT = 2, 4 * BLOCK_SIZE - 8  # 2 blocks + 1 and 120 tokens: 6 blocks each, 11 in all


def prefix_cache_kwargs(engine: str):
    """The adapter's ``prefix_cache_kwargs(block_size, num_blocks, max_model_len)``, or None."""
    try:
        factory = resolve_factory(engine)
    except (ValueError, ImportError, AttributeError):
        return None
    return getattr(factory, "prefix_cache_kwargs", None)


@pytest.fixture(scope="module")
def cache_engine(pytestconfig, engines, options):
    model = next((m for m in selected_models(pytestconfig) if m.name == "qwen3-tiny"),
                 selected_models(pytestconfig)[0])
    make = prefix_cache_kwargs(options.engine)
    if make is None:
        pytest.skip(f"engine {options.engine}: its adapter cannot size the prefix cache (no prefix_cache_kwargs)")
    kwargs = make(BLOCK_SIZE, BLOCKS, BLOCKS * BLOCK_SIZE)
    adapter = engines.get(model, "float32", **kwargs)
    if not supports_requests(adapter):
        pytest.skip(f"engine {adapter.name} has no run_requests (oracle/requests.py)")
    vocab = json.loads((Path(model.path) / "config.json").read_text())["vocab_size"]
    yield adapter, vocab
    engines.close()  # a cache this small is of no use to the other modules


def _prompts(vocab: int) -> tuple[dict[str, list[int]], random.Random]:
    rng = random.Random(29)
    return {name: [rng.randrange(3, vocab) for _ in range(n * BLOCK_SIZE)] for name, n in SEGMENTS.items()}, rng


def _cached(adapter, prompt: list[int], max_tokens: int, **extra: int) -> int:
    params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, **extra}
    try:
        completion = adapter.run_requests([RequestSpec(prompt, params)])[0][0]
    except UnsupportedSetting as e:
        pytest.skip(f"engine lacks a setting: {e}")
    if completion.num_cached_tokens is None:
        pytest.skip(f"engine {adapter.name} reports no cached prompt tokens")
    return completion.num_cached_tokens


def test_cached_tokens_follow_lru(cache_engine) -> None:
    adapter, vocab = cache_engine
    segments, rng = _prompts(vocab)
    got = [_cached(adapter, segments[name] + [rng.randrange(3, vocab)], BLOCK_SIZE) for name, _ in SCRIPT]
    bad = [f"  request {i} ({name}): {g} cached tokens, expected {want}"
           for i, ((name, _), want, g) in enumerate(zip(SCRIPT, EXPECTED, got)) if g != want]
    assert not bad, (f"cached prompt tokens (blocks of {BLOCK_SIZE}, {BLOCKS} blocks; LRU, tail first): got {got}, "
                     f"expected {EXPECTED}:\n" + "\n".join(bad))
    # C0-C2 are cached now, but prompt logprobs need every prompt position computed: no hit (vLLM skips the cache)
    with_prompt_logprobs = _cached(adapter, segments["C"] + [rng.randrange(3, vocab)], 1, prompt_logprobs=1)
    assert with_prompt_logprobs == 0, f"a request with prompt_logprobs reports {with_prompt_logprobs} cached tokens"


def test_cached_tokens_after_preemption(cache_engine) -> None:
    """Two fresh prompts whose outputs cannot both fit: one is preempted and recomputed (its own blocks may then
    hit), but what a request reports is what the cache served at its first admission: nothing."""
    adapter, vocab = cache_engine
    rng = random.Random(31)
    prompts = [[rng.randrange(3, vocab) for _ in range(PREEMPT_PROMPT_BLOCKS * BLOCK_SIZE + 1)] for _ in range(2)]
    before = getattr(adapter, "num_preemptions", None)
    params = {"temperature": 0.0, "max_tokens": PREEMPT_OUTPUT, "ignore_eos": True}
    outs = adapter.run_requests([RequestSpec(p, dict(params)) for p in prompts])
    if before is not None:
        assert adapter.num_preemptions > before, "the two requests should not fit in the cache together"
    got = [o[0].num_cached_tokens for o in outs]
    if None in got:
        pytest.skip(f"engine {adapter.name} reports no cached prompt tokens")
    assert got == [0, 0], f"fresh prompts report {got} cached tokens (a recompute after preemption counted?)"


# Blocks that hold nothing a later request can hit (a request's partial last block) are handed out before every
# cached one (vLLM's BlockPool.free_blocks puts them at the head of the free queue, nanovllm_ref's BlockManager.free
# too). From a cold cache ("_": never used; "p": a partial block):
UNCACHED_FIRST = (
    ("B", BLOCK_SIZE, 0),  # B fills its own block: _ _ _ _ _ _ xB B3 B2 B1 B0
    ("A", 1, 0),           # A's own block stays partial, handed out first: pA _ xB B3 B2 B1 B0 A3 A2 A1 A0
    ("D", 1, 0),           # 3 blocks: pA _ xB (had pA gone to the tail, B3 would be evicted here)
    ("B", 1, 4),           # all of B still cached
)


def test_uncached_blocks_are_reused_first(cache_engine) -> None:
    adapter, vocab = cache_engine
    reset = getattr(adapter, "reset_prefix_cache", None)
    if not callable(reset):
        pytest.skip(f"engine {adapter.name}: a cold cache needs reset_prefix_cache (oracle/adapters.py)")
    reset()
    segments, rng = _prompts(vocab)
    got = [_cached(adapter, segments[name] + [rng.randrange(3, vocab)], max_tokens)
           for name, max_tokens, _ in UNCACHED_FIRST]
    want = [blocks * BLOCK_SIZE for _, _, blocks in UNCACHED_FIRST]
    assert got == want, (f"cached prompt tokens {got}, expected {want}: a partial (uncached) block freed is reused "
                         "before cached blocks")


# Two blocks with the same content: a request with prompt logprobs looks nothing up (every prompt position must be
# computed) but leaves its blocks cached like any other, so they hold the same content as an earlier request's.
# Evicting the earlier copies must leave the content findable in the later ones (vLLM's BlockPool maps a hash to
# every block that holds it). From a cold cache:
TWINS = (
    ("D", {}, 0),                     # D0 D1 + a partial block: pD _ x8 D1 D0
    ("D", {"prompt_logprobs": 1}, 0),  # no lookup; its copies D0' D1': p _ x6 D1 D0 D1' D0'
    (None, {}, 0),                    # 8 fresh blocks + a partial one take p, the 6 never used, D1 and D0
    ("D", {}, 2),                     # D0' D1' hit
)


def test_a_copy_keeps_evicted_content_findable(cache_engine) -> None:
    adapter, vocab = cache_engine
    reset = getattr(adapter, "reset_prefix_cache", None)
    if not callable(reset):
        pytest.skip(f"engine {adapter.name}: a cold cache needs reset_prefix_cache (oracle/adapters.py)")
    reset()
    segments, rng = _prompts(vocab)
    fresh = [rng.randrange(3, vocab) for _ in range(8 * BLOCK_SIZE)]
    got = [_cached(adapter, (segments[name] if name else fresh) + [rng.randrange(3, vocab)], 1, **extra)
           for name, extra, _ in TWINS]
    want = [blocks * BLOCK_SIZE for _, _, blocks in TWINS]
    assert got == want, (f"cached prompt tokens {got}, expected {want}: evicting one of two blocks holding the same "
                         "content must leave the other findable")
