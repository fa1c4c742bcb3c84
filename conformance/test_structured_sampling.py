"""Structured outputs, sampled: an engine's draws under a grammar follow the masked, processed reference distribution.

For each setting (a grammar and sampling settings: temperature, top-k / top-p, penalties, a logit_bias on an allowed
token and on one the grammar forbids), one seeded request draws NUM_SAMPLES completions of 2-3 tokens after a fixed
prefix. The draws of step j are grouped by their history (the j tokens before); each group of at least MIN_GROUP
draws is G-tested (oracle/sampling_reference.py's ``g_test``) against softmax(process(masked logits)): transformers'
logits after prefix + history, every token the reference grammar (oracle/grammar_reference.py, llguidance) forbids
after the history set to -inf first (vLLM applies the grammar's bitmask before anything else reads the logits), then
transformers' processors in the order test_sampling.py checks (bias, penalties, temperature, top-k, top-p). A drawn
token the reference excludes fails at once. False-alarm rate: ALPHA for the whole module on a correct engine,
Bonferroni-split over the settings and the G-tests made (the requests are seeded: NANOVLLM_SAMPLING_SEED moves every
seed). Float32, on test_sampling.py's checkpoint (qwen3-tiny, or the first --model); any engine with
``run_requests`` that takes ``structured_outputs`` (oracle/requests.py; else skipped, naming the setting).
"""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref.oracle.grammar_reference import GrammarReference
from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting
from nanovllm_ref.oracle.sampling_reference import g_test, process

from .structured_specs import ARITHMETIC, SPECS
from .test_sampling import (  # noqa: F401
    base_seed,
    history_groups,
    prefixes,
    request_engine,
    sampler_ref,
    sampling_model,
)

CAPABILITY = "structured outputs"
ALPHA = 1e-3  # false-alarm rate of the module on a correct engine
NUM_SAMPLES, MIN_GROUP = 2000, 200
WORDS = [" self", " return", " x", " if", " None", " True", " def", " for", " value"]


def _bias(ref: GrammarReference, structured: dict, allowed_bias: float, forbidden_bias: float) -> dict[int, float]:
    """A bias on the first allowed non-EOS token and on the first token the grammar forbids at the start."""
    mask = ref.allowed(structured, [])
    allowed = next(t for t in mask.nonzero().flatten().tolist() if t not in ref.table.eos)
    forbidden = int((~mask).nonzero().flatten()[0])
    return {allowed: allowed_bias, forbidden: forbidden_bias}


# name -> (structured_outputs, params from the grammar reference, max_tokens)
SETTINGS = {
    "regex-temperature-1": ({"regex": r"[a-z]{1,8}( [a-z]{1,8})?"}, lambda ref, s: {"temperature": 1.0}, 2),
    "choice-top-k-top-p": ({"choice": WORDS}, lambda ref, s: {"temperature": 0.8, "top_k": 5, "top_p": 0.9}, 2),
    "grammar-penalties-bias": ({"grammar": ARITHMETIC}, lambda ref, s: {
        "temperature": 1.2, "repetition_penalty": 1.3, "frequency_penalty": 0.5,
        "logit_bias": _bias(ref, s, 3.0, 10.0)}, 3),
    "json-pattern-temperature-1.5": (SPECS["string-pattern"].structured, lambda ref, s: {"temperature": 1.5}, 3),
}


@pytest.fixture(scope="module")
def grammar_ref(sampling_model) -> GrammarReference:  # noqa: F811
    return GrammarReference(sampling_model.path)


def masked_probs(sampler_ref, grammar_ref: GrammarReference, structured: dict, prompt: list[int],  # noqa: F811
                 history: list[int], params: dict) -> torch.Tensor:
    """softmax(process(logits with the forbidden tokens at -inf)) of the next token after prompt + history."""
    allowed = grammar_ref.allowed(structured, history)
    logits = sampler_ref.logits(tuple(prompt) + tuple(history)).masked_fill(~allowed, float("-inf"))
    return process(logits, prompt, history, params, sampler_ref.eos).softmax(-1)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_constrained_sampling_distribution(setting, request_engine, sampler_ref, grammar_ref, prefixes) -> None:  # noqa: F811
    structured, make, max_tokens = SETTINGS[setting]
    prompt, params = prefixes[0], make(grammar_ref, structured)
    seed = (base_seed() * 1_000_003 + list(SETTINGS).index(setting) * 10_007 + 77) % 2**63
    spec = RequestSpec(prompt, {**params, "n": NUM_SAMPLES, "max_tokens": max_tokens, "seed": seed,
                                "structured_outputs": structured})
    try:
        completions = request_engine.run_requests([spec])[0]
    except UnsupportedSetting as e:
        pytest.skip(f"engine {request_engine.name} lacks the setting structured_outputs (oracle/requests.py): {e}")
    assert len(completions) == NUM_SAMPLES, f"{setting}: asked n={NUM_SAMPLES}, got {len(completions)}"
    results = []
    for step, by_history in history_groups(completions, max_tokens, list(sampler_ref.eos)).items():
        for history, counter in by_history.items():
            if sum(counter.values()) < MIN_GROUP:
                continue
            probs = masked_probs(sampler_ref, grammar_ref, structured, prompt, list(history), params)
            counts = torch.zeros_like(probs)
            for token, k in counter.items():
                counts[token] += k
            results.append((f"step {step}, history {list(history)}", g_test(counts, probs)))
    assert results, f"{setting}: no history was drawn {MIN_GROUP} times: nothing tested"
    level = ALPHA / len(SETTINGS) / len(results)
    bad = [f"  {where}: {t.describe()}" for where, t in results if t.p_value < level or t.impossible]
    assert not bad, (f"{setting} ({params}, {structured}): draws do not follow the masked reference distribution "
                     f"(level {level:.1e}):\n" + "\n".join(bad))
