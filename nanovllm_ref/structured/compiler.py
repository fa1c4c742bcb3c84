"""Compile a request's `StructuredOutputsParams` into an xgrammar grammar over one tokenizer, with a cache.

What each kind compiles to (vLLM's xgrammar backend, vllm/v1/structured_output/backend_xgrammar.py; xgrammar docs,
"JSON schema", "Regex", "EBNF", "Lark"):

- `json`: the JSON schema (`GrammarCompiler.compile_json_schema`, any whitespace between tokens: vLLM's default);
- `json_object`: the schema `{"type": "object"}` (any JSON object, as vLLM and OpenAI's `json_object`);
- `regex`: the regular expression, matched by the whole output;
- `choice`: the grammar `root ::= "a" | "b" | ...`, the strings JSON-escaped (xgrammar's EBNF literals read JSON's
  escapes);
- `grammar`: EBNF as xgrammar reads it (GBNF: `root ::= ...`) when the text has a `::=`, else Lark
  (`GrammarCompiler.compile_lark`).

JSON text may begin with whitespace (RFC 8259's `ws value ws`): where the vocabulary puts a space before every token
(a decoder joining tokens with spaces: vocab.py), the JSON kinds accept it, else no JSON could be written at all.

The cache is per tokenizer (a `Grammars` belongs to one engine, whose tokenizer it was built for), keyed by the
spec's canonical `key` (a schema's JSON text, spaced one way): a hit costs a dict lookup; the least recently used of
`CACHE_SIZE` compilations goes first (xgrammar's own unbounded cache is off). Thread-safe: the server validates
(compiles) requests on its event loop's thread while the engine thread steps.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from ..sampling_params import StructuredOutputsParams
from .vocab import space_before_every_token, tokenizer_info

CACHE_SIZE = 256
JSON_OBJECT_SCHEMA = '{"type": "object"}'
_XGRAMMAR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[15:06:14] /project/cpp/regex_converter.cc:94: "


def import_xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured_outputs need the xgrammar package: pip install 'xgrammar>=0.2'") from None
    return xgrammar


class Grammars:
    """Compiled grammars of one tokenizer over the model's `vocab_size` ids; `stop_ids`: the tokenizer's EOS ids."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> None:
        self.xgr = import_xgrammar()
        self.info = tokenizer_info(tokenizer, vocab_size, stop_ids)
        self.compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)
        self.leading_space = space_before_every_token(self.info)
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The xgrammar CompiledGrammar of `spec`; ValueError naming `structured_outputs.<kind>` if it is invalid."""
        key = spec.key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        try:
            compiled = self._compile(*key)
        except (RuntimeError, ValueError, TypeError) as e:  # (xgrammar raises RuntimeError for bad input)
            message = _XGRAMMAR_PREFIX.sub("", str(e).strip())
            raise ValueError(f"structured_outputs.{spec.kind}: {message}") from None
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, kind: str, value: Any) -> Any:
        xgr, compiler = self.xgr, self.compiler
        if kind in ("json", "json_object"):
            schema = value if kind == "json" else JSON_OBJECT_SCHEMA
            if not self.leading_space:
                return compiler.compile_json_schema(schema, any_whitespace=True)
            grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=True)
            return compiler.compile_grammar(xgr.Grammar.concat(xgr.Grammar.from_ebnf(r"root ::= [ \t\n]*"), grammar))
        if kind == "regex":
            return compiler.compile_regex(value)
        if kind == "choice":
            return compiler.compile_grammar(choice_grammar(value))
        if "::=" in value:
            return compiler.compile_grammar(value)
        return compiler.compile_lark(value)


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF accepting exactly one of `choices`."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
