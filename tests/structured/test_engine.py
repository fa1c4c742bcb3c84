"""Structured outputs through the engine on the golden checkpoints: each tokenizer kind writes text its regex matches
and JSON its schema accepts; choice, EBNF and Lark grammars, JSON objects; logprobs of the masked distribution;
requests end on EOS once the grammar allows it; bad specs and checkpoints without a tokenizer are refused before
anything changes; a NaN row fails its request, never the mask's -inf; matchers are released."""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import pytest

from golden.load import checkpoint_path
from nanovllm_ref import LLM, SamplingParams, StructuredOutputsParams

from .conftest import VOCAB, allowed

xgr = pytest.importorskip("xgrammar")

PROMPTS = ['x = {"a": 1, "b": true}\ny = ', "json.dumps(", "def main(x):", "data = [1, 2, 3]\n"]
REGEX = "[a-z]{2,8} [0-9]{2}"
ARRAY = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}
ENUM = {"enum": [1, 2, 3, 12, "ab"]}


def generate(llm: LLM, prompts: list, **params) -> list:
    return llm.generate(prompts, SamplingParams(**params), use_tqdm=False)


def spec(**kwargs) -> StructuredOutputsParams:
    return StructuredOutputsParams(**kwargs)


def valid_array(text: str) -> bool:
    value = json.loads(text)  # (leading whitespace is JSON's)
    return isinstance(value, list) and len(value) <= 3 and all(type(x) is int and 0 <= x <= 9 for x in value)


@pytest.fixture(scope="module")
def llm():
    with LLM(checkpoint_path("qwen3-tiny"), dtype="float32", max_model_len=256) as llm:
        yield llm


@pytest.mark.parametrize("name", ["qwen3-tiny", "llama3-tiny", "mistral-spm-hd32", "qwen3-words-hd32"])
def test_each_tokenizer_kind_writes_what_the_grammar_says(name):
    # a word-level tokenizer joins tokens with spaces: every output text begins with one (vocab.py), each word is one
    # token (after " 9" no second digit can follow: one or more digits), and no string can be written (' "' + ' ab')
    words = name == "qwen3-words-hd32"
    regex, enum = (" [a-z]{2,8} [0-9]+", {"enum": [1, 2, 3, 12]}) if words else (REGEX, ENUM)
    with LLM(checkpoint_path(name), dtype="float32", max_model_len=256) as llm:
        for temperature in (0.0, 1.0):
            outs = generate(llm, PROMPTS, temperature=temperature, seed=3, max_tokens=40,
                            structured_outputs=spec(regex=regex))
            assert all(o.finish_reason == "stop" and re.fullmatch(regex, o.text) for o in outs), [o.text for o in outs]
            outs = generate(llm, PROMPTS, temperature=temperature, seed=3, max_tokens=16,
                            structured_outputs=spec(json=enum))
            assert all(o.finish_reason == "stop" and json.loads(o.text) in enum["enum"] for o in outs)
        outs = generate(llm, PROMPTS[:2], temperature=0, max_tokens=48, structured_outputs=spec(json=ARRAY))
        assert all(o.finish_reason == "stop" and valid_array(o.text) for o in outs), [o.text for o in outs]
        assert llm.engine.structured.num_tracked == 0


def test_choice_grammars_and_json_objects(llm):
    choices = ["yes", "no", "maybe so", 'a "quoted" one']
    outs = generate(llm, PROMPTS, temperature=1.0, seed=0, max_tokens=16, structured_outputs=spec(choice=choices))
    assert all(o.finish_reason == "stop" and o.text in choices for o in outs)
    ebnf, lark = (generate(llm, PROMPTS, temperature=0, max_tokens=8, structured_outputs=spec(grammar=g))
                  for g in ('root ::= ("ab" | "cd") [0-9]', 'start: ("ab" | "cd") /[0-9]/'))
    assert [o.token_ids for o in ebnf] == [o.token_ids for o in lark]  # one language, two notations
    assert all(o.finish_reason == "stop" and re.fullmatch("(ab|cd)[0-9]", o.text) for o in ebnf)
    outs = generate(llm, ["print(", "config = "], temperature=0, max_tokens=48,
                    structured_outputs=spec(json_object=True))
    assert all(o.finish_reason == "stop" and isinstance(json.loads(o.text), dict) for o in outs)
    # a schema's object, to the length limit: a prefix of one (what the grammar allowed so far)
    [out] = generate(llm, ["def main(x):"], temperature=0, max_tokens=12, structured_outputs=spec(
        json={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}))
    assert out.finish_reason == "length" and out.text.startswith('{"name')


def test_logprobs_are_the_masked_renormalized_distributions(llm):
    choices = spec(choice=["yes", "no"])
    [out] = generate(llm, ["def main(x):"], temperature=0, max_tokens=8, logprobs=20, structured_outputs=choices)
    grammars = llm.engine.structured.grammars
    matcher = xgr.GrammarMatcher(grammars.compile(choices), override_stop_tokens=[0])
    for token, entry in zip(out.token_ids, out.logprobs):
        mask = xgr.allocate_token_bitmask(1, VOCAB)
        matcher.fill_next_token_bitmask(mask)
        finite = {t for t, lp in entry.items() if lp > -math.inf}
        assert finite <= allowed(mask.numpy()[0]) and token in finite  # (fewer than 20 tokens are allowed)
        assert sum(math.exp(entry[t]) for t in finite) == pytest.approx(1.0, abs=1e-5)
        assert matcher.accept_token(token)
    [plain] = generate(llm, ["def main(x):"], temperature=0, max_tokens=1, logprobs=20)
    assert sum(math.exp(v) for v in plain.logprobs[0].values()) < 0.99  # (the raw distribution spreads wider)


def test_the_request_ends_on_eos_once_the_grammar_ended(llm):
    choices = spec(choice=["yes", "no"])
    outs = generate(llm, PROMPTS, temperature=0, max_tokens=8, structured_outputs=choices)
    assert all(o.finish_reason == "stop" and o.stop_reason is None and o.token_ids[-1] == 0 for o in outs)
    # ignore_eos: past the grammar's end only EOS may come, to the length limit (the text leaves it out)
    outs = generate(llm, PROMPTS, temperature=0, max_tokens=8, ignore_eos=True, structured_outputs=choices)
    for o, stopped in zip(outs, generate(llm, PROMPTS, temperature=0, max_tokens=8, structured_outputs=choices)):
        assert o.finish_reason == "length" and len(o.token_ids) == 8 and o.text == stopped.text
        assert set(o.token_ids[len(stopped.token_ids) - 1:]) == {0}
    # a stop_token_id also ends the grammar
    [out] = generate(llm, ["def main(x):"], temperature=0, max_tokens=8, stop_token_ids=[7], ignore_eos=True,
                     structured_outputs=choices)
    assert out.finish_reason == "stop" and out.stop_reason == 7


@pytest.mark.parametrize("kwargs, words", [
    ({"json": {"type": "objec"}}, 'structured_outputs.json: Unsupported type "objec"'),
    ({"regex": "[a-"}, "structured_outputs.regex: Regex parsing error"),
    ({"grammar": 'root ::= "a" |'}, "structured_outputs.grammar: EBNF parser error"),
    ({"grammar": "start: undefined_rule"}, "structured_outputs.grammar: Lark error"),
])
def test_a_bad_spec_is_refused_before_anything_changes(llm, kwargs, words):
    good = SamplingParams(temperature=0, max_tokens=40, structured_outputs=spec(regex=REGEX))
    bad = SamplingParams(max_tokens=4, structured_outputs=spec(**kwargs))
    with pytest.raises(ValueError, match=re.escape(words)):
        llm.generate([[5, 6, 7], [5, 6, 7]], [good, bad], use_tqdm=False)
    assert not llm.has_unfinished() and llm.engine.structured.num_tracked == 0
    with pytest.raises(ValueError, match=re.escape(words)):
        llm.add_request([5, 6], bad)
    assert not llm.has_unfinished()
    assert re.fullmatch(REGEX, llm.generate([[5, 6, 7]], good, use_tqdm=False)[0].text)


def test_a_checkpoint_without_a_tokenizer_refuses_structured_outputs(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(checkpoint_path("qwen3-tiny"), folder)
    for name in os.listdir(folder):
        if "token" in name and name.endswith(".json"):
            os.remove(folder / name)
    with LLM(str(folder), dtype="float32", max_model_len=128) as llm:
        with pytest.raises(ValueError, match="structured_outputs need a tokenizer"):
            generate(llm, [[5, 6, 7]], max_tokens=4, structured_outputs=spec(regex="a+"))
        assert not llm.has_unfinished()


def test_nan_logits_fail_their_request_and_the_masks_inf_does_not(llm, monkeypatch):
    original, calls = llm.engine.runner.model.compute_logits, []

    def poisoned(hidden):
        logits = original(hidden)
        if not calls:
            logits[0] = float("nan")  # the first step's first row: the first request's
        calls.append(1)
        return logits

    monkeypatch.setattr(llm.engine.runner.model, "compute_logits", poisoned)
    outs = generate(llm, [[9, 9, 9], [5, 6, 7]], temperature=0, max_tokens=40, structured_outputs=spec(regex=REGEX))
    monkeypatch.undo()
    assert outs[0].finish_reason == "error" and "non-finite" in outs[0].error
    assert outs[1].finish_reason == "stop" and re.fullmatch(REGEX, outs[1].text)
    assert llm.engine.structured.num_tracked == 0


def test_matchers_are_released_when_sequences_finish_or_are_aborted(llm):
    params = SamplingParams(max_tokens=30, n=2, structured_outputs=spec(regex="[a-z]{20,30}"))
    rid = llm.add_request([5, 6, 7], params)
    llm.step()
    assert llm.engine.structured.num_tracked == 2  # one per sample
    llm.abort_request(rid)
    assert llm.engine.structured.num_tracked == 0 and not llm.has_unfinished()
