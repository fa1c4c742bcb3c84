"""The grammar's view of each golden tokenizer kind (structured/vocab.py): every token's text in the TokenizerInfo is
the text the engine's detokenizer gives that token as an output token (byte-level BPE, byte fallback + Metaspace,
WordLevel joined with spaces), special tokens have none, and the mask spans the model's vocab_size."""

from __future__ import annotations

import pytest

from nanovllm_ref.engine.detokenizer import IncrementalDetokenizer
from nanovllm_ref.sampling_params import SamplingParams, StructuredOutputsParams
from nanovllm_ref.structured.compiler import Grammars
from nanovllm_ref.structured.vocab import space_before_every_token, special_ids, tokenizer_info

from .conftest import KINDS, VOCAB, allowed, tokenizer

xgr = pytest.importorskip("xgrammar")

PROMPT = "def main(x): return"  # (a few tokens: the detokenizer primes with them)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_token_text_is_the_detokenizers(kind):
    tok = tokenizer(KINDS[kind])
    info = tokenizer_info(tok, VOCAB, [tok.eos_token_id])
    prompt = tok.encode(PROMPT, add_special_tokens=False)
    params = SamplingParams(skip_special_tokens=False)
    special, texts = special_ids(tok), info.decoded_vocab  # (the property builds the list)
    checked = 0
    for t in range(len(tok)):
        text = texts[t]
        if t in special:
            assert text == b"", (t, text)  # no text: never allowed inside a grammar
            continue
        try:
            text = text.decode()
        except UnicodeDecodeError:  # part of a character (byte tokens): no text of its own
            continue
        detok = IncrementalDetokenizer(tok, prompt, params)
        detok.add([t])
        assert detok.text == text, (t, tok.convert_ids_to_tokens(t))
        checked += 1
    assert checked > 1300
    expected = {"byte-level": xgr.VocabType.BYTE_LEVEL, "byte-fallback": xgr.VocabType.BYTE_FALLBACK,
                "word-level": xgr.VocabType.RAW}
    assert info.vocab_type == expected[kind]
    assert space_before_every_token(info) == (kind == "word-level")


def test_a_model_vocabulary_past_the_tokenizers_is_never_allowed():
    tok = tokenizer(KINDS["byte-level"])
    grammars = Grammars(tok, VOCAB + 40, [tok.eos_token_id])
    assert grammars.info.vocab_size == VOCAB + 40
    matcher = xgr.GrammarMatcher(grammars.compile(StructuredOutputsParams(regex="(.|\n)*")))
    mask = xgr.allocate_token_bitmask(1, VOCAB + 40)
    matcher.fill_next_token_bitmask(mask)
    ids = allowed(mask.numpy()[0], VOCAB + 40)
    assert max(ids) < len(tok) and len(ids) > 1400  # any text: every token with text, none past the tokenizer's
    assert tok.eos_token_id in ids  # (the regex may end anywhere)
