"""Speculative decoding in the engine: n-gram and draft-model drafts emit what the plain engine emits.

With n-gram drafts (and greedy requests with any drafts) the verification accepts a draft exactly when the target's
own draw at that position agrees with it (engine/verify.py), so a speculative run must give the same tokens, text,
finish and stop reasons and logprobs as a plain one, whatever the features around it: penalties, bias, min_tokens,
stop strings inside an accepted run, n > 1, prefix caching, chunked prefill, preemption. The distribution of a draft
model's sampled runs is checked statistically by conformance/test_spec_decode.py and the rejection kernel's tests.
"""

from __future__ import annotations

import pytest

from golden.load import checkpoint_path
from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.engine.proposers import ngram_lookup
from nanovllm_ref.speculative import SpeculativeConfig

MODEL = checkpoint_path("qwen3-tiny")
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPTS = ["import json\nimport json\nimport json\ndef f(x):\n    return x\ndef f(x):\n",
           [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], "class A:\n    def __init__(self):\n        self.a = a\n"]
PARAMS = [
    SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0.8, max_tokens=40, seed=3, logprobs=1),
    SamplingParams(temperature=1.0, top_k=5, top_p=0.9, max_tokens=40, seed=4, repetition_penalty=1.2,
                   presence_penalty=0.3, min_tokens=3),
    SamplingParams(temperature=0, max_tokens=40, stop=["json", " x"], logit_bias={5: 1.5}),
    SamplingParams(temperature=0.7, n=3, max_tokens=24, seed=9, stop_token_ids=[8]),
]


def _run(llm: LLM, params: list[SamplingParams]) -> list:
    outs = []
    for sp in params:
        for o in llm.generate(PROMPTS, sp, use_tqdm=False):
            outs.append([(c.token_ids, c.text, c.finish_reason, c.stop_reason,
                          [sorted(d) for d in c.logprobs] if c.logprobs else None) for c in o.outputs])
            assert all(c.logprobs is None or len(c.logprobs) == len(c.token_ids) for c in o.outputs)
    return outs


def _logprob_values(llm: LLM, sp: SamplingParams) -> list[list[float]]:
    return [[d[t] for d, t in zip(o.logprobs, o.token_ids)] for o in llm.generate(PROMPTS, sp, use_tqdm=False)]


@pytest.fixture(scope="module")
def plain() -> list:
    with LLM(MODEL, dtype="float32", device="cpu") as llm:
        return _run(llm, PARAMS), _logprob_values(llm, PARAMS[0])


@pytest.mark.parametrize("settings", [
    {"speculative_config": NGRAM},
    {"speculative_config": {**NGRAM, "num_speculative_tokens": 5}, "enable_prefix_caching": False},
    {"speculative_config": {**NGRAM, "num_speculative_tokens": 1}, "max_num_batched_tokens": 16},  # chunked
    {"speculative_config": NGRAM, "num_kvcache_blocks": 10, "max_model_len": 96},  # preemptions
], ids=["k3", "k5-no-prefix-cache", "k1-chunked", "k3-preempting"])
def test_ngram_speculation_emits_what_the_plain_engine_emits(plain, settings) -> None:
    want, want_lp = plain
    with LLM(MODEL, dtype="float32", device="cpu", **settings) as llm:
        got = _run(llm, PARAMS)
        lp = _logprob_values(llm, PARAMS[0])
        outs = llm.generate(PROMPTS, PARAMS[4], use_tqdm=False)
        stats, preemptions = llm.stats().spec_decoding, llm.stats().num_preemptions
    assert got == want
    assert preemptions > 0 or "num_kvcache_blocks" not in settings
    samples = [c for o in outs for c in o.outputs]  # each sample's own counts, within the engine's totals
    assert all(0 <= c.num_accepted_tokens <= c.num_draft_tokens for c in samples)
    assert 0 < sum(c.num_draft_tokens for c in samples) <= stats.num_draft_tokens
    assert max(abs(a - b) for x, y in zip(lp, want_lp) for a, b in zip(x, y)) < 1e-4
    assert stats.num_draft_tokens > 0 and 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens


def test_draft_model_greedy_emits_the_targets_tokens(plain) -> None:
    """draft = target accepts every greedy draft; a smaller draft (qwen3-tiny for qwen3-gqa4, the same tokenizer)
    accepts fewer, and neither changes a token."""
    target = checkpoint_path("qwen3-gqa4")
    sp = [PARAMS[0], PARAMS[3]]
    with LLM(target, dtype="float32", device="cpu") as llm:
        want = _run(llm, sp)
    for draft, floor in ((target, 0.98), (MODEL, 0.0)):
        spec = {"model": draft, "num_speculative_tokens": 3}
        with LLM(target, dtype="float32", device="cpu", speculative_config=spec) as llm:
            got = _run(llm, sp[:1])
            stats = llm.stats().spec_decoding
            got += _run(llm, sp[1:])
        assert got == want
        assert stats.num_draft_tokens > 0 and stats.acceptance_rate >= floor


def test_layer_skip_draft_with_more_drafts_than_room(tmp_path) -> None:
    """A draft of the target's first layer, k = 5: drafts are rejected at different positions, so near max_tokens
    the sequences of one step have less room than k drafts. Every sequence ends exactly at its second block's
    end (16-token blocks), where a draft written past its room would leave its blocks: the draft KV stays inside
    them and the greedy tokens and logprobs are the target's."""
    from nanovllm_ref.oracle.derived import first_layers_checkpoint

    prompts = [[(7 * i + j) % 300 + 5 for j in range(n)] for i, n in enumerate(range(3, 14))]
    params = [SamplingParams(temperature=0, max_tokens=32 - len(p), ignore_eos=True, logprobs=1) for p in prompts]

    def run(**settings) -> tuple[list, object]:
        with LLM(MODEL, dtype="float32", device="cpu", kvcache_block_size=16, **settings) as llm:
            outs = llm.generate(prompts, params, use_tqdm=False)
            stats = llm.stats().spec_decoding
        return [(o.outputs[0].token_ids, [d[t] for d, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
                for o in outs], stats

    want, _ = run()
    spec = {"model": first_layers_checkpoint(MODEL, 1, tmp_path), "num_speculative_tokens": 5}
    got, stats = run(speculative_config=spec)
    assert [t for t, _ in got] == [t for t, _ in want]
    assert max(abs(a - b) for (_, x), (_, y) in zip(got, want) for a, b in zip(x, y)) < 1e-4
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # some drafts rejected, some accepted


def test_ngram_lookup_takes_the_latest_longest_match() -> None:
    assert ngram_lookup([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2, 1, 3) == [7, 1]
    assert ngram_lookup([4, 5, 1, 2, 6, 2], 3, 1, 3) == [6, 2]  # "2" (n=1) after the longer ones failed
    assert ngram_lookup([1, 2, 3], 2, 1, 3) == []
    assert ngram_lookup([7, 7], 4, 1, 1) == [7]  # a match ending right before the suffix proposes what follows


@pytest.mark.parametrize("value, field", [
    ({"method": "eagle"}, "method"), ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 17}, "num_speculative_tokens"), ({"prompt_lookup_min": 4, "prompt_lookup_max": 2},
                                                                 "prompt_lookup_min"),
    ({"model": "/nonexistent"}, "model"), ({"bogus": 1}, "bogus"), ("ngram", "dict"),
])
def test_bad_speculative_config_names_the_field(value, field) -> None:
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig.from_value(value)


def test_speculation_refuses_async_scheduling_and_a_draft_under_tp() -> None:
    with pytest.raises(ValueError, match="async_scheduling"):
        LLM(MODEL, device="cpu", async_scheduling=True, speculative_config=NGRAM)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLM(MODEL, device="cpu", tensor_parallel_size=2, speculative_config={"model": MODEL})


def test_a_draft_model_must_share_the_tokenizer() -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        LLM(MODEL, device="cpu", speculative_config={"model": checkpoint_path("qwen3-words-hd32")})


def test_speculation_keeps_structured_outputs() -> None:
    """Each verify row is masked by the grammar after the drafts before it (a matcher per sequence, rolled back when
    drafts are rejected): n-gram speculation gives the plain engine's constrained outputs, a draft model's valid
    ones."""
    import re

    from nanovllm_ref.sampling_params import StructuredOutputsParams

    regex = r"(ab|cd)+ [0-9]{3}"
    params = [SamplingParams(temperature=t, seed=2, max_tokens=40, repetition_penalty=1.2, logprobs=1,
                             structured_outputs=StructuredOutputsParams(regex=regex)) for t in (0.0, 0.9)]
    with LLM(MODEL, dtype="float32", device="cpu") as llm:
        want = _run(llm, params)
    with LLM(MODEL, dtype="float32", device="cpu", speculative_config=NGRAM) as llm:
        assert _run(llm, params) == want
        assert llm.stats().spec_decoding.num_accepted_tokens > 0
    with LLM(MODEL, dtype="float32", device="cpu", speculative_config={"model": MODEL}) as llm:
        for o in llm.generate(PROMPTS, params[1], use_tqdm=False):
            prefix = r"(ab|cd)+( [0-9]{0,3})?|(ab|cd)*[ac]?"  # what a run cut by max_tokens may have written
            assert re.fullmatch(regex if o.finish_reason == "stop" else prefix, o.text), o.text
