"""The structured-outputs reference's self-tests (oracle self-tests, never counted as the engine's passes).

The reference conformance/test_structured.py compares engines with is llguidance on the checkpoint's token table
(nanovllm_ref/oracle/grammar_reference.py). Two checks that it is right: xgrammar, a second implementation, allows
the same tokens on the same table along random walks of every spec whose language is vLLM's exactly (the reference
taking RFC 8259's DEL raw in a JSON string, as xgrammar does); and the table spells what the tokenizer decodes
(and, for byte-level and byte-fallback vocabularies, is xgrammar's ``from_huggingface`` table, special tokens
apart).
Run on the checkpoints of test_structured.py (one per tokenizer kind by default), no engine involved.
"""

from __future__ import annotations

import random
import re

import pytest

from nanovllm_ref.oracle.capabilities import SELF_TESTS
from nanovllm_ref.oracle.grammar_crosscheck import XGrammarReference
from nanovllm_ref.oracle.grammar_reference import GrammarReference

from .structured_specs import specs_for
from .test_structured import checkpoint, structured_models  # noqa: F401

CAPABILITY = SELF_TESTS
# after "\u" and up to 3 hex digits (an odd run of backslashes before the u): llguidance refuses lone surrogates
# (\uD800-\uDFFF, not Unicode scalar values, so no UTF-8 text holds them), xgrammar allows any 4 hex digits
INSIDE_U_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u[0-9A-Fa-f]{0,3}$")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "structured_model" in metafunc.fixturenames:
        models = structured_models(metafunc.config)
        metafunc.parametrize("structured_model", models, ids=[m.name for m in models], scope="module")


def random_walk_masks(ref: GrammarReference, alt: GrammarReference, structured: dict, rng: random.Random,
                      steps: int = 30) -> list[str]:
    """Walk the grammar by random allowed tokens; where the two allowed sets differ (RFC 8259's DEL: ``raw_del``)."""
    table, prefix, bad = ref.table, [], []
    for _ in range(steps):
        a, b = ref.allowed(structured, prefix, raw_del=True), alt.allowed(structured, prefix)
        differ = [] if INSIDE_U_ESCAPE.search(table.spell(prefix)) else (a != b).nonzero().flatten().tolist()
        if differ:
            bad.append(f"after {table.spell(prefix)!r}: {ref.name} {[t for t in differ if a[t]][:5]}, {alt.name} "
                       f"{[t for t in differ if b[t]][:5]}")
        both = (a & b).nonzero().flatten().tolist()
        going = [t for t in both if t not in table.eos]
        if not going or (len(going) < len(both) and rng.random() < 0.2):
            break
        prefix.append(rng.choice(going))
    return bad


def test_grammar_reference_agrees_with_xgrammar(checkpoint) -> None:  # noqa: F811
    """llguidance and xgrammar on the same token table allow the same tokens along 12 random walks of every exact
    spec (with RFC 8259's DEL in JSON strings, which xgrammar follows; not compared inside a \\u escape, where only
    xgrammar allows lone surrogates): the reference's masks are not one implementation's quirks."""
    alt, rng, bad = XGrammarReference(checkpoint.model.path), random.Random(0), []
    for name, spec in specs_for(checkpoint.grammar.table.kind, exact_only=True).items():
        for walk in range(12):
            bad += [f"  {name} walk {walk}: {p}" for p in random_walk_masks(checkpoint.grammar, alt, spec.structured,
                                                                           rng)]
    assert not bad, f"{checkpoint.model.name}: the two implementations differ:\n" + "\n".join(bad[:12])


def test_grammar_reference_token_table(checkpoint) -> None:  # noqa: F811
    """The token table spells what the tokenizer decodes: the reference's spelling of a text's tokens, after a context
    token, is the tokenizer's decoding of them there; byte-level and byte-fallback tables are also xgrammar's
    ``from_huggingface`` one (special tokens apart)."""
    from transformers import AutoTokenizer

    tok, table = AutoTokenizer.from_pretrained(checkpoint.model.path), checkpoint.grammar.table
    text = "self . name ( 1 ) : value" if table.kind == "raw" else "Zoë's café: {\"a\": [1, 2.5e-3]} 日本 😀\t\\n"
    ids, context = tok.encode(text, add_special_tokens=False), checkpoint.prompt[:1]
    before, after = tok.decode(context), tok.decode(context + ids)
    bad = [] if after == before + table.spell(ids).decode() else [f"{text!r}: spelled {table.spell(ids)!r}, the "
                                                                  f"tokenizer decodes {after[len(before):]!r}"]
    if table.kind != "raw":
        import xgrammar

        theirs = xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=table.vocab_size).decoded_vocab
        bad += [f"token {i}: {p!r}, xgrammar {theirs[i]!r}" for i, p in enumerate(table.pieces)
                if p is not None and p != theirs[i]][:5]
    assert not bad, f"{checkpoint.model.name} ({table.kind}):\n  " + "\n  ".join(bad)
