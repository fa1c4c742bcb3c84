"""The structured-outputs reference refuses an llguidance that cannot compile vLLM's JSON language
(oracle/grammar_reference.py's ``require_general_escapes``): llguidance 1.7.x (what vLLM 0.32 pins) has no
``json_allow_general_unicode_escapes``, so its free JSON strings refuse ``\\u0041``, which xgrammar (vLLM's backend)
allows; every JSON spec then failed to compile, one confusing error per case. Now one message names the option, the
version and the way out."""

from __future__ import annotations

import pytest

from golden.load import checkpoint_path
from nanovllm_ref.oracle.grammar_reference import GENERAL_ESCAPES_PROBE, GrammarReference, require_general_escapes

llguidance = pytest.importorskip("llguidance")


def test_the_installed_llguidance_compiles_the_probe() -> None:
    ref = GrammarReference(checkpoint_path("qwen3-tiny"))
    require_general_escapes(ref.tokenizer)  # the project's llguidance has the option
    tokens = ref.tokenizer.tokenize_str('"\\u0041"')  # and uses it: a printable \u escape is JSON
    walk = ref.walk({"json": {"type": "string"}}, tokens)
    assert walk.accepted == len(tokens) and walk.accepting


def test_an_llguidance_without_the_option_is_refused_with_its_name(monkeypatch) -> None:
    real = llguidance.LLMatcher.validate_grammar

    def old_llguidance(grammar, tokenizer=None):  # what llguidance 1.7.6 answers
        if "json_allow_general_unicode_escapes" in grammar:
            return ("at 2(8): failed to compile JSON schema: unknown field `json_allow_general_unicode_escapes`, "
                    "expected one of `item_separator`, `key_separator`")
        return real(grammar, tokenizer)

    monkeypatch.setattr(llguidance.LLMatcher, "validate_grammar", staticmethod(old_llguidance))
    with pytest.raises(RuntimeError, match=r"json_allow_general_unicode_escapes .*this one is .*PYTHONPATH"):
        GrammarReference(checkpoint_path("qwen3-tiny"))
    assert "json_allow_general_unicode_escapes" in GENERAL_ESCAPES_PROBE
