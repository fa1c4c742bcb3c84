"""Speculative decoding must not change what the target computes: the goldens, seeds, stops, the prefix cache and
preemption with speculation on, the engine's rejection sampler, and its acceptance counts (the sampled distribution
is test_spec_decode_sampling.py's).

Each case runs once per speculative config the engine advertises (``speculative_configs(model_path)`` on the
adapter's factory; ``--speculative-config JSON`` adds one; without either every case skips naming them; see
oracle/spec_decode.py), on qwen3-tiny in the default sweep, on every ``--model`` otherwise:

* goldens: every golden prompt greedy, top-20 and prompt logprobs, under test_golden.py's policy; speculation must
  have happened where the adapter reports counts (``spec_decode_stats()``: drafts proposed and accepted), and a draft
  model that is the target itself must accept >= 0.98 of its drafts;
* seeds: seeded requests (temperature 1) draw the same tokens when their batch runs again and in another batch;
* stops (greedy): stop token ids and stop strings at positions prompt lookup predicts (so that they fall inside an
  accepted run), and small max_tokens, must give the tokens, text, finish and stop reasons of the same engine without
  speculation, one logprobs entry per token; (sampled): nothing follows a stop token or string, max_tokens holds;
* prefix cache (adapters with ``prefix_cache_kwargs``): a batch run twice and the prompts extended by their greedy
  outputs give the outputs without speculation, and report the blocks computed before as cached (a block hashed with
  a rejected draft breaks the chain); a batch that cannot fit at once (preemption) gives them too;
* the rejection sampler (adapters with ``rejection_sampler()``): oracle/rejection_check.py's statistical check.

Acceptance rates and mean acceptance lengths are recorded per config (the "speculative decoding" section, the JSON
report). References: vLLM tests/v1/spec_decode (test_ngram.py, test_max_len.py) and tests/v1/e2e/test_spec_decode.py
(outputs equal to the engine's without speculation), tests/v1/sample/test_rejection_sampler.py; Leviathan et al. 2023.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nanovllm_ref.oracle.references import run_check
from nanovllm_ref.oracle.requests import Completion, RequestSpec
from nanovllm_ref.oracle.spec_decode import speculation_meta

from .harness import adapter_factory, speculative_cases, tolerance_for
from .speculation import (
    DTYPE,
    counted,
    first_difference,
    float32_tol,
    plain_engine,
    predicted,
    record_run,
    run,
    spec_engine,
    speculation_problems,
)

CAPABILITY = "speculative decoding"
# golden prompts whose greedy runs repeat themselves (prompt lookup's drafts are accepted there)
PROMPT_IDS = ("block_64", "long_300", "block_31", "shared48_c", "block_16")
GREEDY_TOKENS, CONTINUE_TOKENS = 48, 16
STOPS_PER_PROMPT = 3
MAX_TOKENS = (1, 2, 3, 5, 8)
CACHE = dict(block_size=32, num_blocks=14, max_model_len=400)  # 14 blocks: the 5 prompts' runs (24 blocks) preempt
CACHE_PROMPTS = (2, 3)  # the prefix-cache case's prompts (7 blocks with their outputs)


def _greedy(prompt: list[int], max_tokens: int, **extra) -> RequestSpec:
    return RequestSpec(prompt, {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 2,
                                **extra})


@dataclass
class Baseline:
    """The engine's results without speculation, for one checkpoint."""

    prompts: list[list[int]]
    greedy: list[Completion]  # GREEDY_TOKENS greedy tokens of each prompt
    stop_requests: list[tuple[str, RequestSpec]]  # (label, request)
    stop_plain: list[Completion]
    continuations: list[RequestSpec]  # CACHE_PROMPTS' prompts + their greedy tokens, CONTINUE_TOKENS more
    continued: list[Completion]


def stop_cases(prompt: list[int], c: Completion, decode) -> tuple[list[int], list[str]]:
    """Stop token ids and stop strings that end ``c`` at steps prompt lookup predicts (first occurrences), or at
    other first occurrences where it predicts none (a run that never repeats its context: the stop still lands in
    a verification, a draft model's above all)."""
    full, n = prompt + list(c.token_ids), len(prompt)
    first = [j for j in range(2, len(c.token_ids)) if c.token_ids[j] not in c.token_ids[:j]]
    steps = [j for j in first if predicted(full, n + j)] or first
    ids, strings = [c.token_ids[j] for j in steps[:STOPS_PER_PROMPT]], []
    if decode is not None and c.text is not None and decode(c.token_ids) == c.text:
        for j in steps:
            before, upto = decode(c.token_ids[:j]), decode(c.token_ids[: j + 1])
            piece = upto[len(before):].strip() if upto.startswith(before) else ""
            if len(piece) >= 2 and c.text.find(piece) == upto.find(piece, len(before)) >= len(before):
                strings.append(piece)
    return ids, strings[:STOPS_PER_PROMPT]


def make_baseline(adapter, prompts: list[list[int]], decode) -> Baseline:
    greedy = [o[0] for o in run(adapter, [_greedy(p, GREEDY_TOKENS) for p in prompts])]
    requests = [(f"max_tokens={m}", _greedy(prompts[0], m)) for m in MAX_TOKENS]
    for i, (p, c) in enumerate(zip(prompts, greedy)):
        ids, strings = stop_cases(p, c, decode)
        requests += [(f"{PROMPT_IDS[i]}: stop_token_ids=[{t}]", _greedy(p, GREEDY_TOKENS, stop_token_ids=[t]))
                     for t in ids]
        requests += [(f"{PROMPT_IDS[i]}: stop={s!r}", _greedy(p, GREEDY_TOKENS, stop=[s])) for s in strings]
    continuations = [_greedy(prompts[i] + list(greedy[i].token_ids), CONTINUE_TOKENS) for i in CACHE_PROMPTS]
    outs = run(adapter, [r for _, r in requests] + continuations)
    return Baseline(prompts, greedy, requests, [o[0] for o in outs[: len(requests)]], continuations,
                    [o[0] for o in outs[len(requests):]])


@pytest.fixture(scope="module")
def plain(engines, references):
    """``plain(spec)``: the checkpoint's Baseline (computed once, by the engine without speculation)."""
    made: dict[str, Baseline] = {}

    def get(spec) -> Baseline:
        if spec.model.path not in made:
            ref = references.prompts(spec.model, DTYPE)
            by_id = dict(zip(ref.prompt_ids, ref.prompts))
            made[spec.model.path] = make_baseline(plain_engine(engines, spec), [by_id[i] for i in PROMPT_IDS],
                                                  _decoder(spec.model.path))
        return made[spec.model.path]

    return get


def _decoder(path: str):
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return None
    return lambda ids: tok.decode(list(ids), skip_special_tokens=True)


def test_goldens_with_speculation(spec, dtype, options, engines, references, record, record_spec) -> None:
    adapter = spec_engine(engines, spec, dtype)
    ref = references.get(spec.model, dtype)
    with counted(adapter) as c:
        outputs = adapter.generate(ref.prompts, ref.max_tokens, ref.top_k, prompt_logprobs=True)
    tolerance = tolerance_for(dtype, options, ref, getattr(adapter, "quantization", None))
    report = run_check(adapter, ref, tolerance, case=f"{ref.source} [speculative {spec.name}]", outputs=outputs)
    report.meta["speculative"] = speculation_meta(spec, dtype, "goldens, greedy", c.counts)
    record(report)
    record_spec(report.meta["speculative"])
    assert report.passed, f"speculative config {spec.name} ({spec.settings}):\n" + report.format_failures()
    problems = speculation_problems(c.counts, spec, "the goldens (greedy)", self_acceptance=True)
    assert not problems, "\n".join(problems)


def test_seeded_requests_reproduce(spec, engines, references, record_spec) -> None:
    """Seeded requests at temperature 1 draw the same tokens when their batch runs again and in another batch."""
    adapter = spec_engine(engines, spec, requests=True)
    ref = references.prompts(spec.model, DTYPE)
    prompts = dict(zip(ref.prompt_ids, ref.prompts))
    seeded = [RequestSpec(prompts[p], {"temperature": 1.0, "max_tokens": 24, "ignore_eos": True, "seed": 1000 + i})
              for i, p in enumerate(PROMPT_IDS)]
    fillers = [RequestSpec(prompts["block_16"][: 5 + i], {"temperature": 1.0, "max_tokens": 3 + 5 * i,
                                                          "ignore_eos": True}) for i in range(3)]
    greedy = RequestSpec(prompts["long_70"], {"temperature": 0.0, "max_tokens": 10, "ignore_eos": True})
    with counted(adapter) as c:
        first = [o[0].token_ids for o in run(adapter, [*seeded, *fillers])[: len(seeded)]]
        again = [o[0].token_ids for o in run(adapter, [*seeded, *fillers])[: len(seeded)]]
        other = [o[0].token_ids for o in run(adapter, [fillers[2], greedy, *reversed(seeded), fillers[0]])[2:-1]]
    record_run(record_spec, spec, "seeds, temperature 1", c.counts)
    bad = [f"  {PROMPT_IDS[i]} (seed {1000 + i}): {a}, again {b}, in another batch {o}"
           for i, (a, b, o) in enumerate(zip(first, again, reversed(other))) if not a == b == o]
    assert not bad, f"speculative config {spec.name}: seeded requests do not reproduce:\n" + "\n".join(bad)
    runs = [(prompts[p], list(toks)) for p, toks in zip(PROMPT_IDS, first)]
    problems = speculation_problems(c.counts, spec, "the seeded batches", self_acceptance=True, runs=runs)
    assert not problems, "\n".join(problems)


def test_rejection_sampler(pytestconfig, engines) -> None:
    """The engine's rejection sampler on synthetic p / q (oracle/rejection_check.py: its stated false-alarm rate)."""
    from nanovllm_ref.oracle.rejection_check import check_rejection_sampler

    engine = pytestconfig.getoption("--engine")
    if not callable(getattr(adapter_factory(engine), "rejection_sampler", None)):
        pytest.skip(f"engine {engine}: its adapter exposes no rejection_sampler() (a callable with "
                    "kernels/rejection.py's rejection_sample_reference signature)")
    adapter = engines.get(speculative_cases(pytestconfig)[0].model, DTYPE)
    failures = check_rejection_sampler(adapter.rejection_sampler())
    assert not failures, "the engine's rejection sampler:\n" + "\n".join(f"  {f}" for f in failures)


def test_greedy_stops_inside_accepted_runs(spec, engines, plain, record_spec) -> None:
    """Stop token ids, stop strings and max_tokens that end a greedy run inside an accepted run: the same tokens,
    text, finish and stop reasons as the engine without speculation, one logprobs entry per token."""
    base = plain(spec)
    adapter = spec_engine(engines, spec, requests=True)
    with counted(adapter) as c:
        got = [o[0] for o in run(adapter, [r for _, r in base.stop_requests])]
    record_run(record_spec, spec, "greedy stops", c.counts)
    assert any(label.startswith(PROMPT_IDS) for label, _ in base.stop_requests), "no stop case was found: none tested"
    tol = float32_tol(spec)
    bad = [f"  {label}: {d}" for (label, _), g, w in zip(base.stop_requests, got, base.stop_plain)
           if (d := first_difference(g, w, tol))]
    assert not bad, f"speculative config {spec.name}: stops differ from the engine without speculation:\n" + \
        "\n".join(bad)
    runs = [(r.prompt, list(g.token_ids)) for (_, r), g in zip(base.stop_requests, got)]
    assert not speculation_problems(c.counts, spec, "the stop cases", runs=runs)


def sampled_stop_problems(c: Completion, params: dict, decode) -> list[str]:
    """What follows a stop in one sampled completion (or breaks max_tokens, or the logprobs count)."""
    toks, bad = list(c.token_ids), []
    if len(toks) > params["max_tokens"]:
        bad.append(f"{len(toks)} tokens > max_tokens {params['max_tokens']}")
    if c.logprobs is not None and len(c.logprobs) != len(toks):
        bad.append(f"{len(c.logprobs)} logprobs entries for {len(toks)} tokens")
    stops = set(params.get("stop_token_ids", []))
    if any(t in stops for t in toks[:-1]):
        bad.append(f"tokens follow a stop token: {toks}")
    consistent = decode is not None and c.text is not None and decode(toks).startswith(c.text)
    for s in params.get("stop", []):
        if c.text is not None and s in c.text:
            bad.append(f"the text holds the stop string {s!r}: {c.text!r}")
        if consistent and s in decode(toks[:-1]):
            bad.append(f"tokens follow the one that completed {s!r}: {toks}")
    return bad


def test_sampled_stops(spec, engines, plain, record_spec) -> None:
    """Seeded sampled requests with the stop tokens and strings of the greedy cases: nothing follows a stop."""
    base = plain(spec)
    adapter = spec_engine(engines, spec, requests=True)
    decode = _decoder(spec.model.path)
    requests = []
    for i, (_, r) in enumerate(base.stop_requests):
        if "stop" in r.params or "stop_token_ids" in r.params:
            requests.append(RequestSpec(r.prompt, {**r.params, "temperature": 0.8, "n": 4, "seed": 77 + i}))
    with counted(adapter) as c:
        outs = run(adapter, requests)
    record_run(record_spec, spec, "sampled stops, temperature 0.8", c.counts)
    bad = [f"  sample {j} of {r.params.get('stop_token_ids') or r.params.get('stop')}: {p}"
           for r, o in zip(requests, outs) for j, comp in enumerate(o) for p in sampled_stop_problems(comp, r.params,
                                                                                                      decode)]
    assert not bad, f"speculative config {spec.name}:\n" + "\n".join(bad[:12])
    assert any(comp.finish_reason == "stop" for o in outs for comp in o), "no sampled run stopped: nothing checked"


def _cache_engine(spec, engines, options):
    from .test_prefix_cache import prefix_cache_kwargs

    make = prefix_cache_kwargs(options.engine)
    if make is None:
        pytest.skip(f"engine {options.engine}: its adapter cannot size the prefix cache (no prefix_cache_kwargs)")
    return spec_engine(engines, spec, requests=True, **make(CACHE["block_size"], CACHE["num_blocks"],
                                                            CACHE["max_model_len"]))


def test_prefix_cache_with_speculation(spec, engines, plain, options, record_spec) -> None:
    """A greedy batch run twice, then its prompts extended by their outputs: the outputs without speculation, and
    at least the full blocks computed before (all but the last k + 1 tokens of a run) reported cached."""
    base, adapter = plain(spec), _cache_engine(spec, engines, options)
    if callable(getattr(adapter, "reset_prefix_cache", None)):
        adapter.reset_prefix_cache()
    block, tol = CACHE["block_size"], float32_tol(spec)
    batch = [_greedy(base.prompts[i], GREEDY_TOKENS) for i in CACHE_PROMPTS]
    with counted(adapter) as c:
        runs = [[o[0] for o in run(adapter, batch)] for _ in range(2)] + [
            [o[0] for o in run(adapter, base.continuations)]]
    record_run(record_spec, spec, "prefix cache, greedy", c.counts)
    bad = []
    for r, (outs, wants) in enumerate(zip(runs, [[base.greedy[i] for i in CACHE_PROMPTS]] * 2 + [base.continued])):
        for i, (got, want) in enumerate(zip(outs, wants)):
            known = len(base.continuations[i].prompt) if r == 2 else len(base.prompts[CACHE_PROMPTS[i]])
            # run 3's prompts: run 1's prompt and outputs, computed but for the last step's k + 1 tokens at most
            floor = (known - 1 - (spec.k if r == 2 else 0)) // block * block
            if (d := first_difference(got, want, tol)):
                bad.append(f"  run {r + 1}, prompt {i}: {d}")
            if r and got.num_cached_tokens is not None and not floor <= got.num_cached_tokens < known:
                bad.append(f"  run {r + 1}, prompt {i} ({known} tokens): {got.num_cached_tokens} cached, expected "
                           f"{floor} to {known - 1}")
    assert not bad, f"speculative config {spec.name}, prefix cache of {CACHE}:\n" + "\n".join(bad)
    assert not speculation_problems(c.counts, spec, "the prefix-cache runs")


def test_preemption_with_speculation(spec, engines, plain, options, record_spec) -> None:
    """The five prompts at once in a cache too small for them: each run's greedy tokens without speculation."""
    base, adapter = plain(spec), _cache_engine(spec, engines, options)
    before = getattr(adapter, "num_preemptions", None)
    with counted(adapter) as c:
        outs = [o[0] for o in run(adapter, [_greedy(p, GREEDY_TOKENS) for p in base.prompts])]
    record_run(record_spec, spec, "preemption, greedy", c.counts)
    tol = float32_tol(spec)
    bad = [f"  {PROMPT_IDS[i]}: {d}" for i, (g, w) in enumerate(zip(outs, base.greedy))
           if (d := first_difference(g, w, tol))]
    assert not bad, f"speculative config {spec.name}, {CACHE}:\n" + "\n".join(bad)
    if before is not None:
        assert adapter.num_preemptions > before, f"a cache of {CACHE['num_blocks']} blocks preempted nothing"
