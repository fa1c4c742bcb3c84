"""Sampled outputs with speculation on follow the target's per-step processed distribution (test_sampling.py's G-tests
on the positions that verify rows decide).

Per speculative config (test_spec_decode.py says where they come from) and setting, one seeded request with
``n = NUM_SAMPLES`` draws MAX_TOKENS tokens; the draws of step j are grouped by their history (test_sampling.py's
``history_groups``), and every group of at least MIN_GROUP draws is G-tested against the reference's processed
distribution after prompt + history (oracle/sampling_reference.py: transformers' model and processors). Steps 1 and
on are decided by verify rows wherever drafts were proposed, steps 2 and on by rows after an accepted draft; a
setting must test a group at step >= 2 and, where the adapter reports counts, have accepted drafts. Settings:

* on the golden prompt ``shared48_c`` (Python code that repeats itself: prompt lookup proposes drafts): temperature
  0.8; top-k 20 with top-p 0.85; a presence penalty of 1.5 (counts over the output, drafts before a row included);
* on ``block_31`` followed by one token twelve times (the token the model most expects to repeat there, so drafts
  propose it again and again and are often accepted): temperature 1, where the rows of one verification must draw
  independently (rows that shared their noise would repeat an accepted draft far more often than the target does);
  and a frequency penalty of -1 (vLLM's range is [-2, 2]: each occurrence raises the token, so runs of it are long
  and the step-2 group is large), where each row must count the accepted drafts before it (presence and repetition
  penalties count a token once, so they cannot tell a row that ignores its drafts there; +1 shrinks the group that
  shows it to ~270 draws, too few at this false-alarm rate for some seeds).

No setting uses logit_bias or min_p: vLLM 0.32 refuses both with speculative decoding. **Stated false-alarm rate:
ALPHA = 1e-3 for the whole module** (Bonferroni over configs, settings and each setting's G-tests; requests seeded,
NANOVLLM_SAMPLING_SEED shifts the seeds as in test_sampling.py). A draft model that is the target itself must accept
>= 0.98 of its drafts in the settings without penalties (its drafts are drawn from the same distribution).
References: Leviathan et al. 2023 (Theorem 1: the emitted tokens follow the target's distribution); vLLM
tests/v1/sample/test_rejection_sampler.py (its distribution tests), tests/v1/spec_decode.
"""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref.oracle.requests import RequestSpec
from nanovllm_ref.oracle.sampling_reference import ReferenceSampler, g_test

from .harness import speculative_cases
from .speculation import DTYPE, counted, record_run, run, spec_engine, speculation_problems
from .test_sampling import base_seed, history_groups

CAPABILITY = "speculative decoding"
ALPHA = 1e-3  # false-alarm rate of the whole module on a correct engine
NUM_SAMPLES, MAX_TOKENS, MIN_GROUP = 2000, 4, 200
REPEATS = 12  # the repeated token's occurrences at the end of the "repeat" prompt
SETTINGS = {  # name -> (prompt, params)
    "temperature-0.8": ("text", {"temperature": 0.8}),
    "top-k-20-top-p-0.85": ("text", {"temperature": 0.9, "top_k": 20, "top_p": 0.85}),
    "presence-penalty-1.5": ("text", {"temperature": 1.0, "presence_penalty": 1.5}),
    "repeat-temperature-1": ("repeat", {"temperature": 1.0}),
    "repeat-frequency-penalty-minus-1": ("repeat", {"temperature": 1.0, "frequency_penalty": -1.0}),
}


@pytest.fixture(scope="module")
def samplers():
    """``samplers(model)``: the checkpoint's ReferenceSampler (built once)."""
    made: dict[str, ReferenceSampler] = {}

    def get(model) -> ReferenceSampler:
        if model.path not in made:
            made[model.path] = ReferenceSampler(model.path)
        return made[model.path]

    return get


def repeat_prompt(ref: ReferenceSampler, prefix: list[int]) -> list[int]:
    """``prefix`` + one token REPEATS times: of the prefix's tokens and the 16 the model expects next, the one it
    gives the most probability of coming once more (one batched forward)."""
    top = torch.argsort(ref.logits(tuple(prefix)), descending=True, stable=True)[:16].tolist()
    candidates = sorted(set(prefix) | set(top))
    ids = torch.tensor([prefix + [t] * REPEATS for t in candidates])
    with torch.inference_mode():
        logits = ref.model(input_ids=ids).logits[:, -1].float()
    again = logits.log_softmax(-1)[torch.arange(len(candidates)), torch.tensor(candidates)]
    return prefix + [candidates[int(again.argmax())]] * REPEATS


def prompt_of(kind: str, references, spec, ref: ReferenceSampler) -> list[int]:
    golden = references.prompts(spec.model, DTYPE)
    by_id = dict(zip(golden.prompt_ids, golden.prompts))
    return by_id["shared48_c"] if kind == "text" else repeat_prompt(ref, by_id["block_31"])


def g_tests(ref: ReferenceSampler, prompt: list[int], params: dict, completions: list) -> list[tuple]:
    """(step, history, GTest) of every history drawn at least MIN_GROUP times."""
    out = []
    for step, by_history in history_groups(completions, MAX_TOKENS, []).items():
        for history, counter in by_history.items():
            if sum(counter.values()) < MIN_GROUP:
                continue
            probs = ref.scores(prompt, list(history), params).softmax(dim=-1)
            counts = torch.zeros_like(probs)
            for token, k in counter.items():
                counts[token] += k
            out.append((step, history, g_test(counts, probs)))
    return out


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_speculative_sampling_distribution(spec, setting, pytestconfig, engines, references, samplers,
                                           record_spec) -> None:
    adapter = spec_engine(engines, spec, requests=True)
    ref = samplers(spec.model)
    kind, params = SETTINGS[setting]
    prompt = prompt_of(kind, references, spec, ref)
    seed = (base_seed() * 1_000_003 + list(SETTINGS).index(setting) * 10_007 + 4242) % 2**63
    params = {**params, "n": NUM_SAMPLES, "max_tokens": MAX_TOKENS, "ignore_eos": True, "seed": seed}
    with counted(adapter) as c:
        completions = run(adapter, [RequestSpec(prompt, params)])[0]
    record_run(record_spec, spec, f"sampling {setting}", c.counts)
    assert len(completions) == NUM_SAMPLES, f"{setting}: asked n={NUM_SAMPLES}, got {len(completions)}"
    results = g_tests(ref, prompt, params, completions)
    assert any(step >= 2 for step, _, _ in results), (
        f"{setting}: no history after step 1 was drawn {MIN_GROUP} times: no verify row past the first was tested")
    level = ALPHA / len(SETTINGS) / len(speculative_cases(pytestconfig)) / len(results)
    bad = [f"  step {step}, history {list(history)}: {t.describe()}" for step, history, t in results
           if t.p_value < level or t.impossible]
    assert not bad, (f"speculative config {spec.name}, setting {setting} ({SETTINGS[setting][1]}): draws do not follow "
                     f"the target's processed distribution (level {level:.1e}):\n" + "\n".join(bad))
    penalized = any(k.endswith("penalty") for k in params)
    problems = speculation_problems(c.counts, spec, f"setting {setting}", self_acceptance=not penalized)
    assert not problems, "\n".join(problems)
