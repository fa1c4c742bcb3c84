"""Sampling conformance: an engine's draws against transformers' logits processors, and n / seeds / stop strings.

Distribution test: for fixed prefixes, the engine draws NUM_SAMPLES completions (one request with ``n``) of
1-3 tokens under each setting of a grid (temperature, top-k, top-p, min-p, repetition / presence / frequency
penalties, logit bias, min_tokens). The draws of step j are grouped by their history (the j tokens before);
each group of at least MIN_GROUP draws is G-tested against the reference's processed distribution of the
next token after prefix + history (`nanovllm_ref.oracle.sampling_reference`: transformers' model and its
processors in its order, float32 on the CPU). A drawn token the reference excludes fails at once. The stated
false-alarm rate: ALPHA for the whole grid, Bonferroni-split over settings and, within a setting, over the
G-tests made. Requests are seeded (NANOVLLM_SAMPLING_SEED, default 0, shifts every seed), so a run is
reproducible; the false-alarm rate is measured over many values of it.

Engines take part through ``run_requests`` (oracle/requests.py); the engine runs in float32 whatever --dtype
says (the reference is float32 and the test is about the sampler). The semantics tested are vLLM's parameter
names with transformers' processing order (see README "Sampling"): top-k, top-p, then min-p.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict

import pytest
import torch

from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting, supports_requests
from nanovllm_ref.oracle.sampling_reference import ReferenceSampler, g_test

from .harness import ModelSpec, selected_models

ALPHA = 1e-3  # false-alarm rate of the whole distribution test on a correct engine
NUM_SAMPLES = 2000  # completions per (setting, prefix)
MIN_GROUP = 200  # histories drawn fewer times are not tested
PREFIXES = ("def __init__(self, x):\n    self.x = x\n    self.", "import os\nimport sys\n\n\ndef main():\n    ")
DTYPE = "float32"
TOP_K_GOLDEN = 20  # golden/make_sampling.py's TOP_K


def _bias_top(top: list[int], eos: list[int], spec: dict[int, float]) -> dict[int, float]:
    return {top[rank]: b for rank, b in spec.items()}


# name -> (params from (tokens ranked by raw probability at the prefix, EOS ids), max_tokens)
SETTINGS = {
    "temperature-1": (lambda top, eos: {"temperature": 1.0}, 1),
    "temperature-0.7-top-k-5": (lambda top, eos: {"temperature": 0.7, "top_k": 5}, 1),
    "temperature-1.5-top-p-0.7": (lambda top, eos: {"temperature": 1.5, "top_p": 0.7}, 1),
    "top-k-20-top-p-0.85": (lambda top, eos: {"temperature": 0.9, "top_k": 20, "top_p": 0.85}, 1),
    "min-p-0.1": (lambda top, eos: {"temperature": 1.3, "min_p": 0.1}, 1),
    "repetition-penalty-1.3": (lambda top, eos: {"repetition_penalty": 1.3}, 2),
    "repetition-penalty-0.8": (lambda top, eos: {"repetition_penalty": 0.8, "temperature": 1.2}, 2),
    "logit-bias": (lambda top, eos: {"logit_bias": _bias_top(top, eos, {0: -3.0, 2: 2.0, 10: 4.0})}, 1),
    # the top token, pushed up, is drawn twice in a row often: step 3 then sees a count of 2
    "frequency-penalty": (lambda top, eos: {"logit_bias": {top[0]: 5.0}, "frequency_penalty": 2.0}, 3),
    "presence-penalty": (lambda top, eos: {"logit_bias": {top[0]: 5.0}, "presence_penalty": 2.0}, 3),
    "min-tokens": (lambda top, eos: {"logit_bias": {eos[0]: 6.0}, "min_tokens": 2} if eos else {"min_tokens": 2}, 3),
}


def base_seed() -> int:
    return int(os.environ.get("NANOVLLM_SAMPLING_SEED", "0"))


@pytest.fixture(scope="session")
def sampling_model(pytestconfig: pytest.Config) -> ModelSpec:
    """One checkpoint for the sampling tests: qwen3-tiny when selected, else the first --model."""
    models = selected_models(pytestconfig)
    return next((m for m in models if m.name == "qwen3-tiny"), models[0])


@pytest.fixture(scope="session")
def sampler_ref(sampling_model: ModelSpec) -> ReferenceSampler:
    return ReferenceSampler(sampling_model.path)


@pytest.fixture(scope="session")
def prefixes(sampling_model: ModelSpec) -> list[list[int]]:
    """The prefixes as token ids (the checkpoint's tokenizer; fixed pseudo-random ids if it has none)."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(sampling_model.path)
        return [tok.encode(p) for p in PREFIXES]
    except (OSError, ValueError):
        gen = torch.Generator().manual_seed(0)
        return [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (17, 23)]


@pytest.fixture(scope="session")
def request_engine(sampling_model: ModelSpec, engines):
    adapter = engines.get(sampling_model, DTYPE)
    if not supports_requests(adapter):
        pytest.skip(f"engine {adapter.name} has no run_requests (oracle/requests.py): sampling cases need it")
    return adapter


def run(engine, specs: list[RequestSpec]) -> list:
    try:
        return engine.run_requests(specs)
    except UnsupportedSetting as e:
        pytest.skip(f"engine lacks a setting: {e}")


def history_groups(completions: list, max_tokens: int, stops: list[int]) -> dict[int, dict[tuple, Counter]]:
    """step -> history -> Counter of the token drawn after it. A completion that stopped without its stop
    token in token_ids (an engine that strips it) drew the stop token next, when that is unambiguous."""
    groups: dict[int, dict[tuple, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for c in completions:
        tokens = list(c.token_ids)
        if c.finish_reason == "stop" and len(tokens) < max_tokens and (not tokens or tokens[-1] not in stops):
            if len(stops) != 1:
                continue
            tokens.append(stops[0])
        for j, token in enumerate(tokens[:max_tokens]):
            groups[j][tuple(tokens[:j])][token] += 1
    return groups


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sampling_distribution(setting, request_engine, sampler_ref, prefixes) -> None:
    check_distribution(setting, request_engine, sampler_ref, prefixes)


@pytest.fixture(scope="session")
def cuda_engine(sampling_model: ModelSpec, options):
    if options.engine != "nanovllm_ref":
        pytest.skip("the GPU variant drives nanovllm_ref; other engines pick their device themselves")
    from nanovllm_ref.oracle.adapters import NanovllmRefAdapter

    adapter = NanovllmRefAdapter(sampling_model.path, DTYPE, device="cuda", **dict(options.engine_args))
    yield adapter
    adapter.close()


@pytest.mark.gpu
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sampling_distribution_gpu(setting, cuda_engine, sampler_ref, prefixes) -> None:
    """nanovllm_ref on CUDA: the fused Triton sampler and the torch processing path on the GPU."""
    check_distribution(setting, cuda_engine, sampler_ref, prefixes)


def check_distribution(setting: str, request_engine, sampler_ref: ReferenceSampler, prefixes: list[list[int]]) -> None:
    make, max_tokens = SETTINGS[setting]
    eos = sampler_ref.eos
    specs, params_of = [], []
    for i, prefix in enumerate(prefixes):
        top = torch.argsort(sampler_ref.logits(tuple(prefix)), descending=True, stable=True).tolist()
        params = make(top, eos)
        params_of.append(params)
        seed = (base_seed() * 1_000_003 + list(SETTINGS).index(setting) * 10_007 + i * 100_003) % 2**63
        specs.append(RequestSpec(prefix, {**params, "n": NUM_SAMPLES, "max_tokens": max_tokens, "seed": seed}))
    outputs = run(request_engine, specs)
    results = []  # (where, GTest)
    for prefix, params, completions in zip(prefixes, params_of, outputs):
        assert len(completions) == NUM_SAMPLES, f"{setting}: asked n={NUM_SAMPLES}, got {len(completions)}"
        stops = list(params.get("stop_token_ids", [])) + ([] if params.get("ignore_eos") else eos)
        for step, by_history in history_groups(completions, max_tokens, stops).items():
            for history, counter in by_history.items():
                if sum(counter.values()) < MIN_GROUP:
                    continue
                probs = sampler_ref.scores(prefix, list(history), params).softmax(dim=-1)
                counts = torch.zeros_like(probs)
                for token, k in counter.items():
                    counts[token] += k
                where = f"prefix {prefix[-6:]}..., step {step}, history {list(history)}"
                results.append((where, g_test(counts, probs)))
    assert results, f"{setting}: no history was drawn {MIN_GROUP} times: nothing tested"
    level = ALPHA / len(SETTINGS) / len(results)
    bad = [f"  {where}: {t.describe()}" for where, t in results if t.p_value < level or t.impossible]
    assert not bad, (f"setting {setting} ({params_of[0]}): draws do not follow transformers' processed "
                     f"distribution (level {level:.1e}):\n" + "\n".join(bad))


def test_seeded_samples_reproducible_one_by_one(request_engine, prefixes) -> None:
    """Sample i of a seeded request with n > 1 is the request with n = 1 and seed + i (vLLM's convention)."""
    params = {"temperature": 1.0, "max_tokens": 6, "ignore_eos": True}
    seed = 1234 + base_seed()
    group = run(request_engine, [RequestSpec(prefixes[0], {**params, "n": 4, "seed": seed})])[0]
    alone = run(request_engine, [RequestSpec(prefixes[0], {**params, "seed": seed + i}) for i in range(4)])
    assert [c.token_ids for c in group] == [a[0].token_ids for a in alone]
    assert len({tuple(c.token_ids) for c in group}) > 1, "the 4 samples are identical: do they share one seed?"


def test_greedy_ignores_sampling_noise_but_not_penalties(request_engine, prefixes) -> None:
    """Greedy with a penalty is the argmax of the penalized logits: the same for every seed and every sample."""
    params = {"temperature": 0.0, "max_tokens": 8, "ignore_eos": True, "repetition_penalty": 1.3}
    outs = run(request_engine, [RequestSpec(prefixes[1], {**params, "n": 3}),
                                RequestSpec(prefixes[1], {**params, "seed": 5})])
    assert len({tuple(c.token_ids) for o in outs for c in o}) == 1


def _greedy_text(request_engine, prefix: list[int], max_tokens: int) -> tuple[list[int], str]:
    c = run(request_engine, [RequestSpec(prefix, {"temperature": 0.0, "max_tokens": max_tokens,
                                                  "ignore_eos": True})])[0][0]
    if c.text is None:
        pytest.skip("the engine returns no text")
    return list(c.token_ids), c.text


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens(request_engine, sampling_model, prefixes, include) -> None:
    """A stop string made of the end of one token's text and the start of the next is found; the text is cut
    before it (after it with include_stop_str_in_output), the finish reason is "stop"."""
    from transformers import AutoTokenizer

    tokens, text = _greedy_text(request_engine, prefixes[0], 24)
    try:
        tok = AutoTokenizer.from_pretrained(sampling_model.path)
    except (OSError, ValueError):
        pytest.skip("the checkpoint has no tokenizer")
    pieces = [tok.decode(tokens[:i], skip_special_tokens=True) for i in range(len(tokens) + 1)]
    if pieces[-1] != text:
        pytest.skip("the engine's text is not the tokenizer's decoding: token boundaries unknown")
    # the first boundary with text on both sides whose two characters around it occur there first
    cut = next((len(pieces[i]) for i in range(1, len(tokens)) if 0 < len(pieces[i]) < len(text)
                and len(pieces[i - 1]) < len(pieces[i]) and text.find(text[len(pieces[i]) - 1: len(pieces[i]) + 1])
                == len(pieces[i]) - 1), None)
    assert cut is not None, f"no token boundary to test in {text!r}"
    stop = text[cut - 1 : cut + 1]
    c = run(request_engine, [RequestSpec(prefixes[0], {"temperature": 0.0, "max_tokens": 24, "ignore_eos": True,
                                                       "stop": [stop], "include_stop_str_in_output": include})])[0][0]
    assert c.finish_reason == "stop", (stop, c.finish_reason)
    assert c.text == text[: cut - 1 + (len(stop) if include else 0)], (stop, text, c.text)


# ---- goldens: transformers' processors on the golden checkpoints (golden/make_sampling.py) ----------------------

def _golden(model_spec: ModelSpec, dtype: str) -> dict:
    import json
    from pathlib import Path

    from golden.make_sampling import SAMPLING_DIR

    path = Path(SAMPLING_DIR) / f"{model_spec.name}.{dtype}.json"
    if not model_spec.golden:
        pytest.skip(f"{model_spec.name} is not a golden checkpoint: sampling goldens exist for those only")
    if not path.is_file():  # every golden checkpoint has them in both dtypes: an install without them is broken
        pytest.fail(f"{path} is missing: this nanovllm_ref install lacks its sampling goldens (package data)")
    return json.loads(path.read_text())


def _tolerance(model_spec: ModelSpec, dtype: str) -> float:
    from nanovllm_ref.oracle.tolerances import golden_tolerance

    return golden_tolerance(dtype, checkpoint=model_spec.name).tol


def test_sampling_golden_greedy_repetition_penalty(model_spec, dtype, engines) -> None:
    """Greedy under repetition_penalty 0.8 / 1.3 = transformers' RepetitionPenaltyLogitsProcessor + argmax: token
    for token in float32; in bfloat16 up to a first divergence where both tokens are near-tied in the golden's
    penalized distribution (within the dtype's tolerance), as the golden test's policy."""
    gold = _golden(model_spec, dtype)
    engine = engines.get(model_spec, dtype)
    if not supports_requests(engine):
        pytest.skip(f"engine {engine.name} has no run_requests")
    tol, exact = _tolerance(model_spec, dtype), dtype == "float32"
    specs = [RequestSpec(g["prompt"], {"temperature": 0.0, "max_tokens": len(g["token_ids"]), "ignore_eos": True,
                                       "repetition_penalty": g["repetition_penalty"]}) for g in gold["greedy"]]
    bad = []
    for g, out in zip(gold["greedy"], run(engine, specs)):
        got, want = list(out[0].token_ids), g["token_ids"]
        step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if step is None and len(got) == len(want):
            continue
        top = {int(t): v for t, v in g["top_logprobs"][step].items()} if step is not None else {}
        near_tie = step is not None and got[step] in top and top[want[step]] - top[got[step]] <= tol
        if exact or not near_tie:
            bad.append(f"  prompt {g['prompt'][:8]}..., repetition_penalty {g['repetition_penalty']}: first "
                       f"difference at step {step}: engine {got[step] if step is not None else got} vs golden "
                       f"{want[step] if step is not None else want} (golden top: {dict(list(top.items())[:5])})")
    assert not bad, f"{model_spec.name} {dtype} (tolerance {tol:.1e}):\n" + "\n".join(bad)


def test_sampling_golden_processed_logprobs(model_spec, dtype, engines) -> None:
    """logprobs_mode="processed_logprobs": the top-20 after transformers' warpers (temperature, top-k, top-p,
    min-p, repetition penalty) at fixed positions; float32: the same surviving tokens and values within the
    tolerance; bfloat16: values of the tokens both keep within its tolerance, the engine's best kept by both."""
    gold = _golden(model_spec, dtype)
    engine = engines.get(model_spec, dtype)
    if not supports_requests(engine):
        pytest.skip(f"engine {engine.name} has no run_requests")
    tol = _tolerance(model_spec, dtype)
    rows = gold["processed"]
    specs = [RequestSpec(r["prompt"], {**r["params"], "max_tokens": 1, "ignore_eos": True, "seed": 0,
                                       "logprobs": len(r["top_logprobs"]) or 1, "logprobs_mode": "processed_logprobs"})
             for r in rows]
    bad = []
    for r, out in zip(rows, run(engine, specs)):
        want = {int(t): v for t, v in r["top_logprobs"].items()}
        got = {t: v for t, v in out[0].logprobs[0].items() if v > float("-inf")}
        common = set(want) & set(got)
        off = {t: (got[t], want[t]) for t in common if abs(got[t] - want[t]) > tol}
        # float32: the golden's tokens are the engine's top ones; the engine's sampled token may add one when the
        # golden's list was cut at top-k (a smaller list is the whole support)
        extra = {out[0].token_ids[0]} if len(want) == TOP_K_GOLDEN else set()
        support = dtype == "float32" and not (set(want) <= set(got) and set(got) - set(want) <= extra)
        best_lost = max(got, key=got.get) not in want
        if off or support or best_lost:
            bad.append(f"  {r['setting']} at prompt {r['prompt'][:8]}... ({len(r['prompt'])} tokens): values off "
                       f"{off}; kept by the engine only {sorted(set(got) - set(want))}, by the golden only "
                       f"{sorted(set(want) - set(got))}")
    assert not bad, f"{model_spec.name} {dtype} (tolerance {tol:.1e}):\n" + "\n".join(bad)
