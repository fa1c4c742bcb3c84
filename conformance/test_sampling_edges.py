"""Sampling at its edges and in combinations (any engine with run_requests; the sampling checkpoint, float32).

Checked against the reference's processed scores (``nanovllm_ref.oracle.sampling_reference``: transformers'
processors, vLLM's order), each a hard constraint rather than a distribution, so a few draws suffice:

* extreme filters at temperature 1 keep exactly the most likely token, so every draw is the reference's greedy
  token: ``top_k=1``; ``top_p=1e-9`` (float32's ``1 - top_p`` is 1: the top token must be kept explicitly);
  ``min_p=0.9999``; and the same with ``logit_bias={token: 0.0}``, which changes no score but takes an engine's
  processing path for biased rows (nanovllm_ref: the torch path), where the filters must hold too;
* penalties and logit_bias together with top-k / top-p: every first token drawn is one the reference keeps;
* ``min_tokens`` as the only option beside ``stop_token_ids``: greedy, the stop token is the reference's argmax
  at step 1, masked there (min_tokens 3), so the request walks the reference's masked trajectory and stops on it
  only from step 3; sampled (temperature 0.5), the stop token (the reference's top one) never occurs before
  step 3.
"""

from __future__ import annotations

import torch

from nanovllm_ref.oracle.requests import RequestSpec

from .test_sampling import prefixes, request_engine, run, sampler_ref, sampling_model  # noqa: F401

STEPS = 6
EXTREME = {"top-k-1": {"top_k": 1}, "top-p-1e-9": {"top_p": 1e-9}, "min-p-0.9999": {"min_p": 0.9999}}
MIN_TOKENS = 3


def _allowed(sampler_ref, prefix: list[int], history: list[int], params: dict) -> set[int]:  # noqa: F811
    return set(torch.isfinite(sampler_ref.scores(prefix, history, params)).nonzero().flatten().tolist())


def _greedy(sampler_ref, prefix: list[int], params: dict, steps: int, stops: set[int]) -> list[int]:  # noqa: F811
    tokens: list[int] = []
    while len(tokens) < steps:
        tokens.append(int(sampler_ref.scores(prefix, tokens, params).argmax()))
        if tokens[-1] in stops and len(tokens) > params.get("min_tokens", 0):
            break
    return tokens


def test_extreme_filters_keep_the_top_token(request_engine, sampler_ref, prefixes) -> None:  # noqa: F811
    prefix = prefixes[0]
    top = int(sampler_ref.logits(tuple(prefix)).argmax())
    want = _greedy(sampler_ref, prefix, {"temperature": 0.0}, STEPS, set())
    cases = {**EXTREME, **{f"{k}-biased-0": {**v, "logit_bias": {top: 0.0}} for k, v in EXTREME.items()}}
    specs = [RequestSpec(prefix, {"temperature": 1.0, "max_tokens": STEPS, "ignore_eos": True, "n": 2, "seed": 31 + i,
                                  **extra}) for i, extra in enumerate(cases.values())]
    bad = [f"  {name} {cases[name]}: drew {list(c.token_ids)}" for name, outs in zip(cases, run(request_engine, specs))
           for c in outs if list(c.token_ids) != want]
    assert not bad, f"filters that keep only the most likely token (greedy: {want}):\n" + "\n".join(bad)


def test_penalties_and_bias_with_top_k_top_p(request_engine, sampler_ref, prefixes) -> None:  # noqa: F811
    prefix = prefixes[1]
    ranked = torch.argsort(sampler_ref.logits(tuple(prefix)), descending=True, stable=True).tolist()
    cases = {"bias-top-p": {"logit_bias": {ranked[5]: 3.0}, "top_p": 0.3},
             "bias-top-k": {"logit_bias": {ranked[7]: 4.0, ranked[0]: -2.0}, "top_k": 3},
             "repetition-top-p": {"repetition_penalty": 1.5, "top_p": 0.25},
             "frequency-top-k-top-p": {"frequency_penalty": 0.5, "presence_penalty": 0.5, "top_k": 4, "top_p": 0.5}}
    specs = [RequestSpec(prefix, {"temperature": 1.0, "max_tokens": 1, "ignore_eos": True, "n": 24, "seed": 71 + i,
                                  **extra}) for i, extra in enumerate(cases.values())]
    bad = []
    for (name, params), outs in zip(cases.items(), run(request_engine, specs)):
        allowed = _allowed(sampler_ref, prefix, [], {"temperature": 1.0, **params})
        drawn = [c.token_ids[0] for c in outs]
        if not set(drawn) <= allowed:
            bad.append(f"  {name} {params}: drew {sorted(set(drawn) - allowed)}, the reference keeps {sorted(allowed)}")
    assert not bad, "draws outside what the reference's filters keep:\n" + "\n".join(bad)


def test_min_tokens_alone(request_engine, sampler_ref, prefixes) -> None:  # noqa: F811
    prefix = prefixes[0]
    free = _greedy(sampler_ref, prefix, {"temperature": 0.0}, 2, set())
    greedy = {"temperature": 0.0, "min_tokens": MIN_TOKENS, "stop_token_ids": [free[1]], "max_tokens": STEPS}
    want = _greedy(sampler_ref, prefix, greedy, STEPS, {free[1]})
    stop = int(sampler_ref.logits(tuple(prefix)).argmax())
    sampled = {"temperature": 0.5, "min_tokens": MIN_TOKENS, "stop_token_ids": [stop], "max_tokens": MIN_TOKENS,
               "n": 16, "seed": 5}
    outs = run(request_engine, [RequestSpec(prefix, greedy), RequestSpec(prefix, sampled)])
    got = list(outs[0][0].token_ids)
    assert got == want, (f"greedy with min_tokens={MIN_TOKENS}, stop_token_ids=[{free[1]}] (the argmax at step 1): "
                         f"{got}, the reference's {want}")
    early = [list(c.token_ids) for c in outs[1] if stop in c.token_ids[:MIN_TOKENS]]
    assert not early, f"min_tokens={MIN_TOKENS}: the stop token {stop} drawn before step {MIN_TOKENS}: {early}"
