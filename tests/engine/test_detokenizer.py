"""The engine's text (engine/detokenizer.py, LLMEngine's hooks) on the three golden tokenizer kinds: one path for
every request, vLLM's policy (prompt context, skip_special_tokens, spaces_between_special_tokens, stop tokens'
text, stop strings after min_tokens, whole characters only, streaming), and the oracle's independent reference."""

from __future__ import annotations

import random

import pytest

from golden.load import checkpoint_path
from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.engine.detokenizer import IncrementalDetokenizer
from nanovllm_ref.loader import load_tokenizer
from nanovllm_ref.oracle.text_reference import ReferenceText, TextRules
from nanovllm_ref.sampling_params import RequestOutputKind

BPE, WORDS, SPM = "qwen3-tiny", "qwen3-words-hd32", "mistral-spm-hd32"
GREEDY = dict(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def tokenizers():
    return {name: load_tokenizer(str(checkpoint_path(name))) for name in (BPE, WORDS, SPM)}


@pytest.fixture(scope="module")
def words_llm():
    with LLM(str(checkpoint_path(WORDS)), device="cpu") as llm:
        yield llm


def _text(tok, prompt: list[int], output: list[int], **params) -> str:
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(**params))
    detok.add(output)
    return detok.text


def test_word_level_text_is_the_same_with_or_without_stop_strings_streamed_or_not(words_llm):
    """The live bug: stop strings (or streaming) changed a word-level checkpoint's text for the same tokens."""
    prompt = words_llm.tokenizer.encode("def __init__(self, x):")
    plain, stopped = words_llm.generate([prompt, prompt], [SamplingParams(**GREEDY),
                                                           SamplingParams(stop=["\x00"], **GREEDY)], use_tqdm=False)
    assert plain.token_ids == stopped.token_ids and plain.text == stopped.text
    assert plain.text.startswith(" ") and plain.text == " " + words_llm.tokenizer.decode(plain.token_ids)
    words_llm.add_request(prompt, SamplingParams(n=2, output_kind=RequestOutputKind.DELTA, **GREEDY))
    pieces: list[list[str]] = [[], []]
    while words_llm.has_unfinished():
        for out in words_llm.step():
            for c in out.outputs:
                pieces[c.index].append(c.text)
    assert ["".join(p) for p in pieces] == [plain.text] * 2


def test_a_character_split_over_tokens_is_never_streamed_half_and_never_flushed(tokenizers):
    tok = tokenizers[SPM]
    a, b = [t for t in tok.encode("é", add_special_tokens=False) if tok.decode([t]).strip()]
    detok = IncrementalDetokenizer(tok, [5, 6, 7], SamplingParams())
    detok.add([a])
    assert detok.stream() == "" and detok.text == ""
    detok.add([b])
    assert detok.stream() == "é"
    assert _text(tok, [5, 6, 7], [b, a]) == ""  # a run of bytes that never completes is never flushed


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_tokens_text_is_left_out_unless_include_stop_str(tokenizers, include):
    tok = tokenizers[BPE]
    out = tok.encode("x = 1\n")
    detok = IncrementalDetokenizer(tok, [5], SamplingParams(include_stop_str_in_output=include,
                                                            skip_special_tokens=False))
    detok.add(out + [0], stop_terminated=True)
    assert detok.text == "x = 1\n" + ("<|endoftext|>" if include else "")


def test_stop_strings_count_only_after_min_tokens_and_may_begin_inside_them(tokenizers):
    tok = tokenizers[BPE]
    out = tok.encode("import os\nimport sys\n")
    pieces = [tok.decode(out[: i + 1]) for i in range(len(out))]
    j = next(i for i, p in enumerate(pieces) if p.endswith("os"))  # "os" completed by token j
    inside = IncrementalDetokenizer(tok, [5], SamplingParams(stop="os", min_tokens=j + 1))
    assert all(inside.add([t]) is None for t in out)  # completed by the min_tokens-th token: no stop
    across = IncrementalDetokenizer(tok, [5], SamplingParams(stop="t o", min_tokens=j - 1))
    found = [across.add([t]) for t in out]
    assert "t o" in found and across.text == pieces[j][: pieces[j].index("t o")]


def test_special_tokens_skipped_kept_and_joined_without_spaces(tokenizers):
    tok = tokenizers[WORDS]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    word = tok.encode("return")[0]
    assert _text(tok, [word], [end, end, word]) == " return"
    assert _text(tok, [word], [end, end, word], skip_special_tokens=False) == " <|im_end|> <|im_end|> return"
    assert _text(tok, [word], [end, end, word], skip_special_tokens=False,
                 spaces_between_special_tokens=False) == " <|im_end|><|im_end|> return"


def test_stream_holds_back_a_possible_stop_string_then_hands_out_the_rest(tokenizers):
    tok = tokenizers[BPE]
    detok = IncrementalDetokenizer(tok, [5], SamplingParams(stop=["STOP"]))
    streamed = ""
    for t in tok.encode("abc STO and more"):
        detok.add([t])
        streamed += detok.stream()
        assert "abc STO and more".startswith(streamed) and len(detok.text) - len(streamed) <= 3
    assert streamed + detok.stream(finished=True) == "abc STO and more"


def test_the_engine_reports_stop_reasons_as_vllm(words_llm):
    prompt = words_llm.tokenizer.encode("def __init__(self, x):")
    plain = words_llm.generate([prompt], SamplingParams(**GREEDY), use_tqdm=False)[0]
    eos = words_llm.tokenizer.eos_token_id
    outs = words_llm.generate([prompt] * 3, [
        SamplingParams(stop_token_ids=[plain.token_ids[2]], **GREEDY),
        SamplingParams(stop=[plain.text[3:5]], **GREEDY),
        SamplingParams(temperature=0.0, max_tokens=5, min_tokens=2, logit_bias={eos: 100.0, 7: 50.0})],
        use_tqdm=False)
    assert [(o.finish_reason, o.stop_reason) for o in outs] == [
        ("stop", plain.token_ids[2]), ("stop", plain.text[3:5]), ("stop", None)]
    assert outs[2].token_ids == [7, 7, eos]


class _WithoutBackend:
    """A tokenizer without a Rust backend (the detokenizer then runs its window over `decode`)."""

    def __init__(self, tok) -> None:
        self.tok, self.added_tokens_decoder = tok, tok.added_tokens_decoder

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.mark.parametrize("name", [BPE, WORDS, SPM])
def test_rust_stream_window_fallback_and_the_oracles_reference_agree(tokenizers, name):
    """DecodeStream (fast tokenizers), the window over `decode` (others) and oracle/text_reference.py give the
    same text for random prompts and outputs rich in byte tokens, for every skip / spaces setting."""
    tok, ref, rng = tokenizers[name], ReferenceText(str(checkpoint_path(name))), random.Random(0)
    partial = [i for i in range(1536) if "\ufffd" in tok.decode([i])] or list(range(4))
    for _ in range(40):
        draw = [rng.choice(partial) if rng.random() < 0.4 else rng.randrange(1536) for _ in range(26)]
        prompt, output = draw[: rng.randrange(1, 10)], draw[10:]
        for skip, spaces in ((True, True), (False, True), (False, False)):
            params = SamplingParams(skip_special_tokens=skip, spaces_between_special_tokens=spaces)
            texts = []
            for t in (tok, _WithoutBackend(tok)):
                detok = IncrementalDetokenizer(t, prompt, params)
                detok.add(output)
                texts.append(detok.text)
            rules = TextRules(skip_special_tokens=skip, spaces_between_special_tokens=spaces)
            assert texts == ["".join(ref.pieces(prompt, output, rules))] * 2, (prompt, output, skip, spaces)
