"""Batch invariance for any engine: a needle request's output must not depend on what else the engine runs.

vLLM's batch-invariance tests (tests/v1/determinism: a needle prompt alone vs at a random position in batches of
64-128, bs=1 vs bs=N logprobs compared with ``torch.equal``) and "Defeating Nondeterminism in LLM Inference"
(Thinking Machines, 2025) as a module any adapter runs. The needle (golden prompts) is generated alone, then at a
random position among fillers of other lengths (random token ids, 1-200 tokens) in batches of random sizes, with
and without a cached shared prefix (the fillers and a warm-up request share the needle's first tokens, so a
prefix cache serves them), under several prefill chunk budgets for engines that take ``max_num_batched_tokens``
(each with and without the cached prefix), greedy and seeded sampling. The prefix cache is emptied before each
run that a case compares (where the adapter has ``reset_prefix_cache``), so that only the shared-prefix cases are
served from it, and such a case fails when the engine reports fewer cached tokens than the shared prefix.

``--invariance`` picks the verdict:

* ``tolerance`` (default): the engine against itself under the dtype policy: float32 within the tight
  invariance bound with no divergence allowed; bfloat16 within the golden bfloat16 tolerance, where a divergence
  must be a near-tie (each side's token in the other's top-k), as for the goldens. Catches batch-position bugs
  (a wrong slot, a mask that leaks across requests, a per-batch norm) in any engine.
* ``exact``: tokens and every logprob bitwise equal. For engines with a batch-invariant mode (vLLM's
  ``VLLM_BATCH_INVARIANT=1``); an engine without one is expected to fail it, and the failure names the batch
  composition (size, position, seed, chunk budget, prefix) that broke it.

``--invariance-trials N`` (default 3) compositions per needle and case: the CPU run stays short; on a GPU use 20.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from nanovllm_ref.oracle.compare import EngineOutput
from nanovllm_ref.oracle.references import Reference, run_check
from nanovllm_ref.oracle.requests import Completion, RequestSpec, UnsupportedSetting, supports_requests
from nanovllm_ref.oracle.tolerances import Tolerance, golden_tolerance, invariance_tolerance

REFERENCE_FREE = True  # runs under --reference none

SIZES = (1, 2, 3, 7, 16, 17, 31, 64, 100, 128, 256)  # batch sizes a composition draws from (graph-bucket edges)
FILLER_LEN = (1, 200)
SHARED_PREFIX = 32  # tokens the prefix case shares with the needle (two 16-token blocks)
NEEDLES = 2  # golden prompts used as needles: the first and the longest
BUDGET_ENGINES = ("nanovllm_ref", "vllm")  # in-process engines whose factory takes max_num_batched_tokens
BUDGETS = (13, 48)  # prefill chunk budgets: a needle's prompt spans several steps, cut off block boundaries
BUDGET_SIZES = SIZES[:5]  # compositions of the chunk-budget case stay small: a 13-token budget is many steps
SEEDED = {"temperature": 0.8, "seed": 1234}
# engine settings that let a prefix cache hold SHARED_PREFIX: vLLM's CPU build caches whole 128-token blocks by
# default, so a 32-token shared prefix would never be served from its cache
PREFIX_BLOCK = {"vllm": {"block_size": 32}}


def prefix_block(options) -> dict:
    """PREFIX_BLOCK's settings for the engine under test, except those its --engine-arg sets itself."""
    return {k: v for k, v in PREFIX_BLOCK.get(options.engine, {}).items() if k not in dict(options.engine_args)}


@pytest.fixture(scope="module")
def mode(pytestconfig) -> str:
    return pytestconfig.getoption("--invariance")


@pytest.fixture(scope="module")
def trials(pytestconfig) -> int:
    return pytestconfig.getoption("--invariance-trials")


def tolerance(mode: str, dtype: str, model: str) -> tuple[Tolerance, bool]:
    """(tolerance, divergence allowed) of a needle-in-batch comparison with the needle alone."""
    if mode == "exact":
        return Tolerance(dtype, 0.0, 0.0, derivation="exact: bitwise equal"), False
    if dtype == "float32":
        return invariance_tolerance(), False
    return golden_tolerance(dtype, checkpoint=model), True


def vocab_size(model_path: str) -> int:
    return json.loads((Path(model_path) / "config.json").read_text())["vocab_size"]


def needles(ref: Reference) -> list[int]:
    longest = max(range(len(ref.prompts)), key=lambda i: len(ref.prompts[i]))
    return sorted({0, longest})[:NEEDLES]


def composition(rng: random.Random, vocab: int, prefix: list[int] | None,
                sizes: tuple[int, ...] = SIZES) -> tuple[list[list[int]], int]:
    """Fillers of a random batch size (the needle's slot left at a random position): (fillers, position)."""
    size = rng.choice(sizes)
    fillers = []
    for _ in range(size - 1):
        body = [rng.randrange(vocab) for _ in range(rng.randint(*FILLER_LEN))]
        fillers.append((prefix or []) + body)
    return fillers, rng.randrange(size)


def compare(adapter, alone: EngineOutput, got: EngineOutput, ref: Reference, i: int, label: str, mode: str,
            dtype: str, record) -> None:
    tol, diverge = tolerance(mode, dtype, ref.model)
    single = Reference(ref.model, ref.model_path, dtype, [ref.prompts[i]], [ref.prompt_ids[i]], [alone],
                       ref.max_tokens, ref.top_k, source="needle alone")
    report = run_check(adapter, single, tol, case=f"batch-invariance {mode}: {label}", outputs=[got],
                       prompt_logprobs=False, allow_divergence=diverge)
    if not report.passed:
        record(report)
    assert report.passed, f"needle {ref.prompt_ids[i]} {label}:\n" + report.format_failures()


def empty_prefix_cache(adapter) -> None:
    """Empty the engine's prefix cache where the adapter can: otherwise the needle's own prompt blocks, cached by
    its run alone, would serve it in every batch, and a case without a shared prefix would still test a cache hit."""
    reset = getattr(adapter, "reset_prefix_cache", None)
    if reset is not None:
        reset()


def check_cache_hit(got: EngineOutput, prefix: list[int] | None, label: str) -> None:
    """The cached-prefix case must have had its hit (where the engine reports cached tokens): else it compared
    two uncached runs and said nothing about prefix-cache invariance."""
    cached = got.num_cached_tokens
    if prefix is not None and cached is not None and cached < len(prefix):
        raise AssertionError(f"{label}: the engine served {cached} of the needle's {len(prefix)} shared prefix "
                             "tokens from its prefix cache, so the case tested no cache hit; give the engine a KV "
                             f"block size that divides {len(prefix)} (--engine-arg)")


def run_case(adapter, ref: Reference, dtype: str, mode: str, trials: int, record, case: str,
             prefix_cache: bool, sizes: tuple[int, ...] = SIZES) -> None:
    vocab = vocab_size(ref.model_path)
    for i in needles(ref):
        needle = ref.prompts[i]
        prefix = needle[:SHARED_PREFIX] if prefix_cache and len(needle) > SHARED_PREFIX else None
        empty_prefix_cache(adapter)
        alone = adapter.generate([needle], ref.max_tokens, ref.top_k, False)[0]
        rng = random.Random(f"{ref.model}/{ref.prompt_ids[i]}/{case}/{prefix is not None}")
        for t in range(trials):
            empty_prefix_cache(adapter)
            if prefix is not None:  # the shared prefix is in the cache before the batch comes
                adapter.generate([prefix + [rng.randrange(vocab)]], 1, 1, False)
            fillers, pos = composition(rng, vocab, prefix, sizes)
            batch = fillers[:pos] + [needle] + fillers[pos:]
            got = adapter.generate(batch, ref.max_tokens, ref.top_k, False)[pos]
            label = (f"{case}, trial {t}: batch of {len(batch)}, needle at {pos}"
                     f"{f', fillers share its first {SHARED_PREFIX} tokens (cached)' if prefix else ''}"
                     f"{'' if got.num_cached_tokens is None else f', {got.num_cached_tokens} cached tokens'}")
            check_cache_hit(got, prefix, label)
            compare(adapter, alone, got, ref, i, label, mode, dtype, record)


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["no-prefix", "cached-prefix"])
def test_needle_greedy(model_spec, dtype, options, engines, references, mode, trials, record,
                       prefix_cache) -> None:
    ref = references.prompts(model_spec, dtype)
    adapter = engines.get(model_spec, dtype, **prefix_block(options))
    run_case(adapter, ref, dtype, mode, trials, record, "greedy", prefix_cache)


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["no-prefix", "cached-prefix"])
@pytest.mark.parametrize("budget", BUDGETS, ids=lambda b: f"budget-{b}")
def test_needle_chunk_budget(model_spec, dtype, options, engines, references, mode, trials, record,
                             budget, prefix_cache) -> None:
    """The needle's prompt in chunks of `budget` tokens, alone and in batches; with the shared prefix cached, the
    chunks start after the cache hit (where engines mis-place a chunk's keys after a hit)."""
    if options.engine not in BUDGET_ENGINES:
        pytest.skip(f"--engine {options.engine}: the chunk budget is an engine setting this module sets only for "
                    f"{BUDGET_ENGINES}; run the module with --engine-arg max_num_batched_tokens=N instead")
    ref = references.prompts(model_spec, dtype)
    adapter = engines.get(model_spec, dtype, max_num_batched_tokens=budget, **prefix_block(options))
    run_case(adapter, ref, dtype, mode, trials, record, f"max_num_batched_tokens={budget}", prefix_cache,
             sizes=BUDGET_SIZES)


def _seeded(ref: Reference, prompt: list[int]) -> RequestSpec:
    return RequestSpec(list(prompt), {**SEEDED, "max_tokens": ref.max_tokens, "ignore_eos": True,
                                      "logprobs": 5})


def _as_output(c: Completion) -> EngineOutput:
    return EngineOutput(list(c.token_ids), list(c.logprobs or []), None)


def test_needle_seeded(model_spec, dtype, options, engines, references, mode, trials, record) -> None:
    """A seeded sampled needle: its draws and logprobs must not depend on the batch (fillers sample unseeded).
    Under ``tolerance`` only float32 runs: a bfloat16 near-tie may flip a seeded draw legitimately."""
    if mode == "tolerance" and dtype != "float32":
        pytest.skip("seeded draws are compared in float32 under --invariance tolerance (bf16 near-ties may flip)")
    ref = references.prompts(model_spec, dtype)
    adapter = engines.get(model_spec, dtype, **prefix_block(options))
    if not supports_requests(adapter):
        pytest.skip(f"{getattr(adapter, 'name', adapter)} has no run_requests (seeded sampling)")
    vocab, i = vocab_size(ref.model_path), needles(ref)[-1]
    empty_prefix_cache(adapter)
    try:
        alone = _as_output(adapter.run_requests([_seeded(ref, ref.prompts[i])])[0][0])
    except UnsupportedSetting as e:
        pytest.skip(str(e))
    rng = random.Random(f"{ref.model}/seeded")
    for t in range(trials):
        empty_prefix_cache(adapter)
        fillers, pos = composition(rng, vocab, None)
        specs = [RequestSpec(f, {"temperature": 1.0, "max_tokens": ref.max_tokens, "ignore_eos": True})
                 for f in fillers]
        specs.insert(pos, _seeded(ref, ref.prompts[i]))
        got = _as_output(adapter.run_requests(specs)[pos][0])
        assert got.token_ids == alone.token_ids, (
            f"seeded needle {ref.prompt_ids[i]} (seed {SEEDED['seed']}), trial {t}: batch of {len(specs)}, needle at "
            f"{pos}: tokens {got.token_ids} differ from alone {alone.token_ids}")
        compare(adapter, alone, got, ref, i, f"seeded, trial {t}: batch of {len(specs)}, needle at {pos}", mode,
                dtype, record)
