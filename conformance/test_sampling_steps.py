"""Sampling over many steps: every logprobs_mode along a whole trajectory, and seeds (any engine with run_requests).

Trajectories. A seeded request of STEPS tokens runs under penalties that build up over steps (frequency and
presence counts of the output so far, repetition over prompt and output), logit_bias and min_tokens, once per
logprobs_mode (vLLM's names: ``raw_logprobs``, ``raw_logits``, ``processed_logprobs``, ``processed_logits``) with
the same seed, so the four runs must draw the same tokens (the mode only says what is reported). The trajectory is
then fed back through the reference (``nanovllm_ref.oracle.sampling_reference``: transformers' model and
processors, float32 on the CPU): at every step j, the reference's scores after prompt + tokens[:j] under the
request's settings are what the engine must report (raw: of the model's logits; processed: after bias,
min_tokens, penalties, temperature and top-k/top-p/min-p, vLLM's definition). Checked at every step: each value the
engine reports within the float32 tolerance of the reference's (scaled by 1/temperature where processed), the
reference's top tokens present, the drawn token one the reference allows; greedy: the drawn token is the
reference's argmax (the engine must walk the reference's own trajectory). The biased tokens repeat within the
trajectory, so a count kept wrong (once per token, presence as frequency, prompt tokens counted, shared by the n
samples of a request) shows as a value off by a penalty.

Seeds. Unseeded requests in one batch must be independent: NUM_UNSEEDED requests of one prompt draw their first
token; the number of pairs that drew the same token is compared with its distribution under independence
(multinomial draws from the reference's probabilities, simulated NULL_DRAWS times): false-alarm rate ALPHA.
Seeded requests must draw the same tokens alone and at other positions of batches of other requests (seeded,
unseeded, penalized, greedy, finishing early), and as sample i of an ``n`` request with seed - i.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting
from nanovllm_ref.oracle.sampling_reference import ReferenceSampler, process

from .test_sampling import base_seed, prefixes, request_engine, run, sampler_ref, sampling_model  # noqa: F401

STEPS = 12  # tokens per trajectory
TOP = 20  # logprobs asked per step (vLLM's max_logprobs)
MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
ALPHA = 1e-3  # false-alarm rate of the independence test on a correct engine
NUM_UNSEEDED, NULL_DRAWS = 48, 20_000


def _biased(top: list[int], ranks: tuple[int, ...], bias: float) -> dict[int, float]:
    return {top[r]: bias for r in ranks}


# name -> (params from (tokens ranked by raw probability at the prefix, EOS ids), prefix index, n); heavily biased
# tokens come back step after step, so their counts reach 3 and more within the trajectory; with n = 2 each sample
# keeps its own counts
TRAJECTORIES = {
    "frequency": (lambda top, eos: {"logit_bias": _biased(top, (0, 1, 2), 20.0), "frequency_penalty": 1.0}, 0, 2),
    "presence": (lambda top, eos: {"logit_bias": _biased(top, (0, 1, 2), 20.0), "presence_penalty": 1.5}, 1, 1),
    "repetition": (lambda top, eos: {"repetition_penalty": 1.5, "temperature": 0.8}, 0, 1),
    "mixed-top-k": (lambda top, eos: {"logit_bias": _biased(top, (0, 1), 7.0), "frequency_penalty": 0.6,
                                      "presence_penalty": 0.5, "repetition_penalty": 1.2, "top_k": 20,
                                      "temperature": 0.9}, 1, 1),
    "min-tokens": (lambda top, eos: {"logit_bias": {eos[0]: 8.0}, "min_tokens": 4} if eos else {"min_tokens": 4}, 0, 1),
    "greedy-frequency": (lambda top, eos: {"temperature": 0.0, "logit_bias": _biased(top, (0, 1), 20.0),
                                           "frequency_penalty": 1.0}, 1, 1),
}


def reference_scores(ref: ReferenceSampler, prompt: list[int], history: list[int], params: dict,
                     mode: str) -> torch.Tensor:
    """(vocab,) what an engine reports under `mode` after prompt + history (vLLM's logprobs_mode semantics)."""
    raw = ref.logits(tuple(prompt) + tuple(history))
    if mode.startswith("raw"):
        return raw if mode == "raw_logits" else raw.log_softmax(-1)
    processed = process(raw, prompt, history, params, ref.eos)
    return processed if mode == "processed_logits" else processed.log_softmax(-1)


def step_problems(got: dict[int, float], want: torch.Tensor, drawn: int, tol: float) -> list[str]:
    """What is wrong with one step's reported {token: value} against the reference's (vocab,) scores."""
    bad = []
    if drawn not in got:
        bad.append(f"the drawn token {drawn} is not among the reported ones")
    if not math.isfinite(float(want[drawn])):
        bad.append(f"drew token {drawn}, which the reference excludes")
    off = {t: (round(v, 5), round(float(want[t]), 5)) for t, v in got.items()
           if not (v == float(want[t]) or abs(v - float(want[t])) <= tol)}
    if off:
        bad.append(f"values (engine, reference) off: {dict(list(off.items())[:4])}")
    finite = want[want.isfinite()]
    if len(finite):
        kth = finite.topk(min(TOP, len(finite))).values[-1]
        missing = [t for t in torch.nonzero(want > kth + tol).flatten().tolist() if t not in got]
        if missing:
            bad.append(f"reference top tokens not reported: {missing[:6]}")
    return bad


def run_modes(request_engine, prompt: list[int], params: dict) -> dict:  # noqa: F811
    """logprobs_mode -> the request's completions, all modes in one batch behind a request that finishes after 3
    tokens (the rows behind it move up); an engine whose mode is an engine-wide setting (vLLM) runs the modes it
    takes one by one, and the others are left out (none: skipped)."""
    specs = {m: RequestSpec(prompt, {**params, "logprobs_mode": m}) for m in MODES}
    early = RequestSpec(prompt[:5], {"temperature": 1.0, "max_tokens": 3, "ignore_eos": True})  # its row leaves early
    try:
        return dict(zip(MODES, request_engine.run_requests([early, *specs.values()])[1:]))
    except UnsupportedSetting:
        pass
    runs = {}
    for m, spec in specs.items():
        try:
            runs[m] = request_engine.run_requests([spec])[0]
        except UnsupportedSetting:
            continue
    if not runs:
        pytest.skip(f"engine {request_engine.name} takes none of the logprobs modes {MODES}")
    return runs


def sample_problems(sampler_ref, prompt: list[int], params: dict, mode: str, completion, tol: float) -> list[str]:  # noqa: F811
    """Every step of one completion against the reference fed its tokens."""
    tokens = list(completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        return [f"{mode}: not one logprobs dict per token"]
    temperature = params.get("temperature", 1.0)
    if mode.startswith("processed") and temperature > 0:
        tol /= temperature
    bad = []
    for j, (got, drawn) in enumerate(zip(completion.logprobs, tokens)):
        want = reference_scores(sampler_ref, prompt, tokens[:j], params, mode)
        problems = step_problems(got, want, drawn, tol)
        if temperature == 0 and mode == "processed_logits" and float(want[drawn]) < float(want.max()) - tol:
            problems.append(f"greedy drew {drawn}, the reference's argmax is {int(want.argmax())}")
        bad += [f"  {mode}, step {j} (after {tokens[:j]}): {p}" for p in problems]
    return bad


def check_trajectory(name: str, request_engine, sampler_ref, prefixes, tol: float) -> None:  # noqa: F811
    make, which, n = TRAJECTORIES[name]
    prompt, eos = prefixes[which], sampler_ref.eos
    top = torch.argsort(sampler_ref.logits(tuple(prompt)), descending=True, stable=True).tolist()
    params = {**make(top, eos), "max_tokens": STEPS, "logprobs": TOP, "seed": 4242 + base_seed(), "n": n}
    runs = run_modes(request_engine, prompt, params)
    first = next(iter(runs))
    samples = [list(c.token_ids) for c in runs[first]]
    assert len(samples) == n, f"{name}: asked n={n}, got {len(samples)} completions"
    differ = {m: [c.token_ids for c in cs] for m, cs in runs.items() if [list(c.token_ids) for c in cs] != samples}
    assert not differ, f"{name}: the seeded draws depend on logprobs_mode: {first} {samples}, others {differ}"
    bad = [f"  sample {i}{line}" for mode, cs in runs.items() for i, c in enumerate(cs)
           for line in sample_problems(sampler_ref, prompt, params, mode, c, tol)]
    assert not bad, f"trajectory {name} ({params}), tokens {samples}:\n" + "\n".join(bad[:12])
    if name in ("frequency", "presence", "greedy-frequency"):  # else the counts above were never tested past 1
        assert all(max(Counter(t).values()) >= 3 for t in samples), f"{name}: no token came back 3 times in {samples}"


@pytest.mark.parametrize("name", list(TRAJECTORIES))
def test_logprobs_modes_along_trajectory(name, request_engine, sampler_ref, prefixes, sampling_model) -> None:  # noqa: F811
    from nanovllm_ref.oracle.tolerances import golden_tolerance

    tol = golden_tolerance("float32", checkpoint=sampling_model.name if sampling_model.golden else None).tol
    check_trajectory(name, request_engine, sampler_ref, prefixes, tol)


# ---- seeds ------------------------------------------------------------------------------------------------------

def colliding_pairs(tokens: list[int]) -> int:
    return sum(k * (k - 1) // 2 for k in Counter(tokens).values())


def null_collisions(probs: torch.Tensor, n: int, draws: int, seed: int = 0) -> torch.Tensor:
    """(draws,) colliding pairs among n independent draws from `probs`, simulated: in each sorted row of draws, a
    draw collides with each equal one before it (its index minus its run's start)."""
    gen = torch.Generator().manual_seed(seed)
    drawn = torch.multinomial(probs.expand(draws, -1), n, replacement=True, generator=gen).sort(dim=1).values
    index = torch.arange(n).expand(draws, n)
    starts = torch.ones_like(drawn, dtype=torch.bool)
    starts[:, 1:] = drawn[:, 1:] != drawn[:, :-1]
    return (index - torch.where(starts, index, 0).cummax(dim=1).values).sum(dim=1)


def test_unseeded_requests_independent(request_engine, sampler_ref, prefixes) -> None:  # noqa: F811
    """NUM_UNSEEDED unseeded requests of one prompt in one batch (temperature 1.5: a flat distribution) draw their
    first token independently: the colliding pairs are no more than independence allows (one-sided p >= ALPHA)."""
    params = {"temperature": 1.5, "max_tokens": 3, "ignore_eos": True}
    outs = run(request_engine, [RequestSpec(prefixes[1], dict(params)) for _ in range(NUM_UNSEEDED)])
    firsts = [o[0].token_ids[0] for o in outs]
    probs = process(sampler_ref.logits(tuple(prefixes[1])), prefixes[1], [], params, sampler_ref.eos).softmax(-1)
    observed = colliding_pairs(firsts)
    null = null_collisions(probs.double(), NUM_UNSEEDED, NULL_DRAWS)
    p_value = (1 + int((null >= observed).sum())) / (NULL_DRAWS + 1)
    assert p_value >= ALPHA, (f"unseeded requests are not independent: {observed} pairs of {NUM_UNSEEDED} requests "
                              f"drew the same first token (independence: mean {float(null.double().mean()):.1f}, "
                              f"p = {p_value:.1e}); first tokens {firsts}")
    full = Counter(tuple(o[0].token_ids) for o in outs).most_common(1)[0]
    assert full[1] < NUM_UNSEEDED // 2, f"{full[1]} of {NUM_UNSEEDED} unseeded requests drew the same {list(full[0])}"


def test_seeded_requests_independent_of_batch(request_engine, prefixes) -> None:  # noqa: F811
    """Two seeded requests (one on the plain sampler, one penalized) draw the same tokens alone, at other positions
    of batches with other requests that finish early or late, and as sample i of an n=3 request seeded seed - i."""
    seed = 777 + base_seed()
    plain = RequestSpec(prefixes[0], {"temperature": 1.0, "top_k": 50, "max_tokens": 10, "ignore_eos": True,
                                      "seed": seed})
    penalized = RequestSpec(prefixes[1], {"temperature": 0.9, "frequency_penalty": 0.5, "max_tokens": 10,
                                          "ignore_eos": True, "seed": seed + 1})
    fillers = [RequestSpec(prefixes[i % 2][: 5 + i], {"temperature": 1.0, "max_tokens": 2 + 3 * i, "ignore_eos": True,
                                                      **({"seed": 99 + i} if i % 2 else {})}) for i in range(4)]
    greedy = RequestSpec(prefixes[1], {"temperature": 0.0, "max_tokens": 7, "ignore_eos": True})
    alone = [run(request_engine, [s])[0][0].token_ids for s in (plain, penalized)]
    batches = {"first of 6": [plain, penalized, *fillers],
               "middle of 7": [fillers[0], greedy, plain, fillers[1], penalized, fillers[2], fillers[3]],
               "last of 6": [*reversed(fillers), penalized, plain]}
    bad = []
    for label, batch in batches.items():
        outs = run(request_engine, batch)
        for spec, want in zip((plain, penalized), alone):
            got = outs[batch.index(spec)][0].token_ids
            if got != want:
                bad.append(f"  {label}: seed {spec.params['seed']} drew {got}, alone {want}")
    for spec, want in zip((plain, penalized), alone):
        group = run(request_engine, [RequestSpec(spec.prompt, {**spec.params, "n": 3, "seed": spec.params["seed"] - 2}),
                                     fillers[1]])[0]
        if group[2].token_ids != want:
            bad.append(f"  sample 2 of n=3 seeded {spec.params['seed'] - 2}: {group[2].token_ids}, alone {want}")
    assert not bad, "seeded requests depend on the batch:\n" + "\n".join(bad)
