"""The structured-outputs specs of conformance/test_structured.py, which vocabulary each fits, and what "valid" means.

Each :class:`Spec` is one ``structured_outputs`` setting (vLLM's keys: ``json``, ``regex``, ``choice``, ``grammar``,
``json_object``) with the vocabulary kinds that can spell it (nanovllm_ref/oracle/grammar_reference.py's
``TokenTable.kind``: a WordLevel vocabulary spells only its words, each after a space, so it gets specs made of
those, prefix-free: free JSON has dead ends there, " n" starting "null" with no token to follow it) and whether the
reference's language is vLLM's (xgrammar's) exactly, so that the distribution under it can be compared token for
token: ``exact=False`` names the documented difference, and such a spec is checked for validity only. Validity
(:func:`why_invalid`): a JSON spec's output parses (``json.loads``, RFC 8259) and validates against the schema
(``jsonschema``, Draft 2020-12; ``json_object``: an object); a regex is ``re.fullmatch``-ed; a choice is one of its
strings; a grammar's output is accepted whole by the reference matcher (llguidance), as every output is too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

SPELLS_TEXT = ("byte-level", "byte-fallback")  # vocabularies whose tokens spell any text (raw: its words only)


@dataclass(frozen=True)
class Spec:
    structured: dict[str, Any]
    kinds: tuple[str, ...] = SPELLS_TEXT
    exact: bool = True  # the reference's language is vLLM's (xgrammar's): the distribution is compared
    why: str = ""  # where exact is False: the difference


def _obj(properties: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


WORD_ITEMS = 'root ::= " (" item (" ," item)* " )"\nitem ::= " x" | " y" | " " [0-9]\n'
ARITHMETIC = 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"\n'

SPECS: dict[str, Spec] = {
    "empty-schema": Spec({"json": {}}),
    "enum": Spec({"json": _obj({"color": {"enum": ["red", "green", "blue"]}, "n": {"enum": [1, 2, None]}},
                               ["color", "n"])}),
    "nested": Spec({"json": _obj({"user": _obj({"id": {"type": "integer", "minimum": 0},
                                                "name": {"type": "string", "pattern": "^[a-z]{1,6}$"}},
                                               ["id", "name"])}, ["user"])}),
    "array-bounds": Spec({"json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                   "minItems": 2, "maxItems": 4}}),
    "string-pattern": Spec({"json": {"type": "string", "pattern": "^[a-z]{2,5}-[0-9]{2}$"}}),
    "unicode": Spec({"json": _obj({"free": {"type": "string", "pattern": "^[a-zé日本☃]{0,3}$"},
                                   "word": {"enum": ["héllo", "日本", "😀 ok"]}}, ["free", "word"])}),
    # properties in the schema's order, which is not alphabetical (xgrammar keeps the order of the schema it is given)
    "property-order": Spec({"json": _obj({"zeta": {"enum": [1, 2]}, "alpha": {"type": "boolean"}},
                                         ["zeta", "alpha"])}),
    "integer-bounds": Spec({"json": _obj({"i": {"type": "integer", "minimum": 1, "maximum": 300},
                                          "j": {"type": "integer", "minimum": 5, "maximum": 12}}, ["i", "j"])}),
    "number-bounds": Spec({"json": _obj({"x": {"type": "number", "minimum": 0, "maximum": 1}}, ["x"])}, exact=False,
                          why="xgrammar caps the digits of a bounded number's fraction, llguidance does not"),
    "string-max-length": Spec({"json": {"type": "string", "maxLength": 5}}, exact=False,
                              why="xgrammar's length-bounded string allows raw control characters and no escapes "
                                  "(RFC 8259 the reverse)"),
    "optional-properties": Spec({"json": _obj({"a": {"type": "boolean"}, "b": {"type": "null"},
                                               "c": {"type": "integer", "minimum": 0}}, ["b"])}),
    "json-object": Spec({"json_object": True}),
    "regex": Spec({"regex": r"[a-z]{1,6}(-[0-9]{1,3})?"}),
    "choice": Spec({"choice": ["yes", "no", "maybe not"]}),
    "grammar": Spec({"grammar": ARITHMETIC}),
    # a WordLevel vocabulary: every token spells a space first (" x"), so its strings and keys have spaces too, and
    # the specs are prefix-free on it (" n" starts " null" and " name", and no token can follow it: a dead end)
    "words-json": Spec({"json": _obj({" x ": {"enum": [" a ", " b "]}, " y ": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}}, [" x ", " y "])},
                       ("raw",)),
    "words-regex": Spec({"regex": r"( [a-z0-9]){1,4}"}, ("raw",)),
    "words-choice": Spec({"choice": [" a", " b", " x", " 0"]}, ("raw",)),
    "words-grammar": Spec({"grammar": WORD_ITEMS}, ("raw",)),
}


def specs_for(kind: str, exact_only: bool = False) -> dict[str, Spec]:
    return {n: s for n, s in SPECS.items() if kind in s.kinds and (s.exact or not exact_only)}


def why_invalid(structured: dict[str, Any], text: str) -> str | None:
    """Why ``text`` (a whole output) does not satisfy ``structured`` (None: it does). Grammars: the caller's matcher."""
    import jsonschema

    from nanovllm_ref.oracle.grammar_reference import check_spec, schema_of

    key, value = check_spec(structured)
    if key in ("json", "json_object"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            return f"not JSON ({e})"
        try:
            jsonschema.validate(doc, schema_of(structured))
        except jsonschema.ValidationError as e:
            return f"does not validate: {e.message}"
        return None
    if key == "regex":
        return None if re.fullmatch(value, text) else f"does not fullmatch {value!r}"
    if key == "choice":
        return None if text in value else f"not one of {value}"
    return None
