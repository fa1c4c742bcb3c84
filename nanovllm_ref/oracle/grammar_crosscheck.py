"""The second implementation of the structured-outputs reference: xgrammar's allowed sets on the same token table.

conformance/test_structured_reference.py (an oracle self-test) compares :class:`XGrammarReference` with
:class:`~nanovllm_ref.oracle.grammar_reference.GrammarReference` (llguidance) along walks of every spec whose
language is vLLM's exactly: the same tokens must be allowed, with RFC 8259's DEL in JSON strings (``raw_del``,
grammar_reference.py's module docstring), which xgrammar follows. The compilation is vLLM's xgrammar backend's
(vllm/v1/structured_output/backend_xgrammar.py: ``compile_json_schema(any_whitespace=True)``, ``compile_regex``,
``choice_as_grammar``, ``compile_grammar``), on :func:`~nanovllm_ref.oracle.grammar_reference.token_table`'s table
given as xgrammar's RAW vocabulary (special tokens as empty strings, which xgrammar never allows).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from .grammar_reference import GrammarReference, _bits, _dead_end_ends, check_spec, schema_of, token_table


class XGrammarReference(GrammarReference):
    """xgrammar's allowed sets on the same token table: the second implementation of the self-tests."""

    name = "xgrammar"

    def __init__(self, model_path: str) -> None:
        import xgrammar

        self.table = token_table(model_path)
        encoded = [p if p is not None else b"" for p in self.table.pieces]  # empty: xgrammar's special tokens
        info = xgrammar.TokenizerInfo(encoded, xgrammar.VocabType.RAW, vocab_size=self.table.vocab_size,
                                      stop_token_ids=list(self.table.eos))
        self.compiler, self.grammars = xgrammar.GrammarCompiler(info, max_threads=1), {}
        self._init_del()

    def compile(self, structured: dict[str, Any]) -> Any:
        import xgrammar

        key, value = check_spec(structured)
        if key in ("json", "json_object"):
            schema = json.dumps(schema_of(structured))
            if not self.table.leading_space:
                return self.compiler.compile_json_schema(schema, any_whitespace=True)
            lead = xgrammar.Grammar.from_ebnf(r"root ::= [ \t\n]*")
            return self.compiler.compile_grammar(
                xgrammar.Grammar.concat(lead, xgrammar.Grammar.from_json_schema(schema, any_whitespace=True)))
        if key == "regex":
            return self.compiler.compile_regex(value)
        if key == "choice":  # vLLM's choice_as_grammar
            return self.compiler.compile_grammar("root ::= " + " | ".join(
                '"' + c.replace("\\", "\\\\").replace('"', '\\"') + '"' for c in value))
        return self.compiler.compile_grammar(value)

    def _allowed(self, structured: dict[str, Any], prefix: list[int]) -> torch.Tensor:
        """As :meth:`GrammarReference.allowed`, from a fresh xgrammar matcher fed ``prefix``."""
        import xgrammar

        key = self._key(structured)
        matcher = xgrammar.GrammarMatcher(self.grammars[key])
        for t in prefix:
            if matcher.is_terminated() or not matcher.accept_token(t):
                return torch.zeros(self.table.vocab_size, dtype=torch.bool)
        if matcher.is_terminated():
            return torch.zeros(self.table.vocab_size, dtype=torch.bool)
        bitmask = xgrammar.allocate_token_bitmask(1, self.table.vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        return _dead_end_ends(_bits(bitmask.numpy()[0].view(np.uint32), self.table.vocab_size), self.table.eos)
