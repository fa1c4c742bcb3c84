"""The structured-outputs reference: which tokens a grammar allows after a token prefix, for one checkpoint's tokenizer.

A request's ``structured_outputs`` setting is a dict with exactly one of vLLM's keys (``json``: a JSON schema, dict
or str; ``regex``; ``choice``: a list of strings; ``grammar``: an EBNF (GBNF) grammar; ``json_object``: true). The
reference turns it into an llguidance grammar (https://github.com/guidance-ai/llguidance, an implementation
independent of xgrammar, which vLLM and nanovllm_ref use) and gives, for any token prefix, the set of tokens the
grammar allows next (:meth:`GrammarReference.allowed`), and how much of a token sequence it accepts
(:meth:`GrammarReference.walk`). grammar_crosscheck.py computes the same from xgrammar
(https://github.com/mlc-ai/xgrammar) on the same token table: the oracle's self-tests compare the two.

What a token spells (:func:`token_table`, one table for both implementations): byte-level BPE (a ``ByteLevel``
decoder) maps each character back through GPT-2's byte-to-unicode table; byte fallback (a ``ByteFallback`` decoder)
reads ``<0xNN>`` as the byte NN and the Metaspace ``▁`` as a space (a word start after the prompt); any other
vocabulary spells the text the token adds to the output after an ordinary token, as the tokenizer decodes it (a
WordLevel tokenizer without a decoder joins tokens with spaces: "ab" spells " ab"), so that the output text is what
the grammar read (xgrammar's ``from_huggingface`` would take the string "ab" as it is, and the text would not match).
The tokenizer's special tokens spell nothing: the grammar never allows them, except an EOS id (config.json and
generation_config.json) where the grammar accepts what came before (skip_special_tokens drops a special token from
the text, so text built with one would not be what the grammar constrained; llguidance's and vLLM's guidance
backend's rule; xgrammar's ``from_huggingface`` instead matches a special token's string as text).

vLLM's conventions, which the reference follows: a JSON schema is compiled as vLLM's xgrammar backend does by
default (any whitespace ``[ \n\r\t]*`` between JSON tokens, none before the value; properties in the schema's
order; the suite's schemas say ``additionalProperties: false`` where xgrammar's strict mode would imply it);
``json_object`` is the schema ``{"type": "object"}``; where every token spells a space first (WordLevel) JSON may
begin with whitespace ``[ \t\n]*`` (RFC 8259's ``ws value``; else nothing could be written); ``choice`` is the
alternation of its strings; a regex must match the whole output. llguidance's forcing of canonical tokenizations is
off (``no_forcing``): every token whose bytes the grammar allows is allowed, as in xgrammar. Known convention
differences: DEL (U+007F) raw in a JSON string, which RFC 8259 and xgrammar allow and llguidance refuses
(``allowed(..., raw_del=True)`` gives the former: wherever the grammar allows the token "~" raw, in a free JSON
string, it allows the DEL token too; the checks accept either), and the integer ``-0``, which only llguidance allows
(the suite's integer schemas are non-negative), and lone surrogate escapes (``\\uD800``-``\\uDFFF`` alone), which
xgrammar allows and llguidance refuses, as the reference does (no UTF-8 text holds one). The second implementation:
grammar_crosscheck.py.
"""

from __future__ import annotations

import functools
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

KEYS = ("json", "regex", "choice", "grammar", "json_object")
WHITESPACE = r"[ \n\r\t]*"  # vLLM's default (xgrammar's any_whitespace) between JSON tokens
CACHE = 8192  # matcher states kept per reference


def eos_ids(model_path: str) -> tuple[int, ...]:
    from .sampling_reference import eos_ids as ids

    return tuple(ids(model_path))


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (character -> byte)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shifted = dict(zip(keep, keep)), 0
    for b in range(256):
        if b not in chars:
            chars[b], shifted = 256 + shifted, shifted + 1
    return {chr(c): b for b, c in chars.items()}


@dataclass(frozen=True)
class TokenTable:
    """What every token spells (None: a special token), the vocabulary's kind and its EOS ids."""

    kind: str  # "byte-level" | "byte-fallback" | "raw"
    pieces: tuple[bytes | None, ...]
    eos: tuple[int, ...]
    vocab_size: int  # the model's (the mask's length); ids past the table spell nothing

    @property
    def leading_space(self) -> bool:
        """Whether every token with text spells whitespace first (a decoder joining tokens with spaces)."""
        texts = [p for i, p in enumerate(self.pieces) if p and i not in self.eos]
        return bool(texts) and all(p[:1].isspace() for p in texts)

    def spell(self, tokens: list[int]) -> bytes:
        """The bytes of a token sequence as the grammar reads them (special tokens and EOS spell nothing)."""
        return b"".join(self.pieces[t] or b"" for t in tokens if t < len(self.pieces))


def _kind(model_path: str) -> str:
    with open(os.path.join(model_path, "tokenizer.json")) as f:
        decoder = json.dumps(json.load(f).get("decoder"))
    return "byte-level" if "ByteLevel" in decoder else "byte-fallback" if "ByteFallback" in decoder else "raw"


def _piece(kind: str, s: str) -> bytes:
    if kind == "byte-level":
        return bytes(_byte_decoder()[c] for c in s)
    if kind == "byte-fallback":
        if len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            return bytes([int(s[3:5], 16)])
        return s.replace("\u2581", " ").encode()
    return s.encode()


@functools.lru_cache(maxsize=16)
def token_table(model_path: str) -> TokenTable:
    """The token table of a checkpoint's tokenizer (module docstring)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    with open(os.path.join(model_path, "config.json")) as f:
        vocab_size = max(int(json.load(f)["vocab_size"]), len(tok))
    kind = _kind(model_path)
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    if kind == "raw":
        pieces = _in_context(tok, special)
    else:
        pieces = tuple(None if i in special else _piece(kind, tok.convert_ids_to_tokens(i)) for i in range(len(tok)))
    return TokenTable(kind, pieces, eos_ids(model_path), vocab_size)


def _in_context(tok: Any, special: set[int]) -> tuple[bytes | None, ...]:
    """Each token's text after an ordinary token (the tokenizer's decoding of the pair, less the first's)."""
    ordinary = [i for i in range(len(tok)) if i not in special]
    context = next(i for i in ordinary if tok.decode([i]))
    before = tok.decode([context])
    pairs = dict(zip(ordinary, tok.batch_decode([[context, i] for i in ordinary])))
    for i, text in pairs.items():
        if not text.startswith(before):
            raise ValueError(f"decoding token {i} after token {context} changes the text before it: {text!r}")
    return tuple(None if i in special else pairs[i][len(before):].encode() for i in range(len(tok)))


def check_spec(structured: dict[str, Any]) -> tuple[str, Any]:
    """(key, value) of a structured_outputs dict with exactly one of :data:`KEYS` set."""
    given = [(k, v) for k, v in structured.items() if v not in (None, False)]
    if len(given) != 1 or given[0][0] not in KEYS:
        raise ValueError(f"structured_outputs needs exactly one of {KEYS}, got {sorted(structured)}")
    return given[0]


def schema_of(structured: dict[str, Any]) -> dict | None:
    """The JSON schema of a ``json`` / ``json_object`` spec (None for the others)."""
    key, value = check_spec(structured)
    if key == "json_object":
        return {"type": "object"}
    if key == "json":
        return json.loads(value) if isinstance(value, str) else value
    return None


def to_lark(structured: dict[str, Any], leading_space: bool = False) -> str:
    """The llguidance (Lark) grammar of a structured_outputs dict, forcing off, vLLM's JSON whitespace (and JSON's
    leading whitespace with ``leading_space``: module docstring)."""
    key, value = check_spec(structured)
    header = '%llguidance {"no_forcing": true}\n'
    if key in ("json", "json_object"):
        schema = {**schema_of(structured), "x-guidance": {"whitespace_pattern": WHITESPACE,
                                                        "json_allow_general_unicode_escapes": True}}
        if leading_space:
            return header + "start: LEAD? value\nvalue: %json " + json.dumps(schema) + "\nLEAD: /[ \\t\\n]+/"
        return header + "start: %json " + json.dumps(schema)
    if key == "regex":
        return header + "start: /" + value.replace("/", "\\/") + "/"
    if key == "choice":
        return header + "start: " + " | ".join(json.dumps(c) for c in value)
    from llguidance.gbnf_to_lark import any_to_lark

    return header + any_to_lark(value)


GENERAL_ESCAPES_PROBE = ('%llguidance {}\nstart: %json {"type": "string", "x-guidance": '
                         '{"json_allow_general_unicode_escapes": true}}')


def require_general_escapes(tokenizer: Any) -> None:
    """Refuse an llguidance without ``json_allow_general_unicode_escapes`` (1.9.1 has it, 1.7.6 not; vLLM 0.32
    pins llguidance<1.8): its JSON strings refuse every ``\\uXXXX`` escape of a printable character, which xgrammar
    (vLLM's language) and RFC 8259 allow, so its masks would not be vLLM's in any free JSON string."""
    import llguidance

    error = llguidance.LLMatcher.validate_grammar(GENERAL_ESCAPES_PROBE, tokenizer)
    if error:
        version = getattr(llguidance, "__version__", "?")
        raise RuntimeError(
            "the structured-outputs reference needs an llguidance with json_allow_general_unicode_escapes (1.9.1 "
            f"has it); this one is {version} ({llguidance.__file__}), which refuses the option: "
            f"{error.splitlines()[0]}. Where the engine "
            "pins an older one (vLLM 0.32: llguidance<1.8), put a newer one first on the test process's path only, "
            "e.g. pip install --target DIR --no-deps 'llguidance>=1.9' and PYTHONPATH=DIR (vLLM loads llguidance "
            "only for its guidance backend)")


def _bits(words: np.ndarray, vocab_size: int) -> torch.Tensor:
    bits = np.unpackbits(words.astype("<u4").view(np.uint8), bitorder="little")[:vocab_size]
    return torch.from_numpy(bits.astype(bool))


def _dead_end_ends(mask: torch.Tensor, eos: tuple[int, ...]) -> torch.Tensor:
    """A state where the vocabulary can spell nothing the grammar allows ends the output: EOS (vLLM would sample
    from all -inf logits there; the suite's specs never reach one)."""
    if not mask.any():
        mask[list(eos)] = True
    return mask


@dataclass(frozen=True)
class Walk:
    accepted: int  # tokens of the sequence the grammar accepted, in order (the first refused one stops it)
    accepting: bool  # whether the grammar accepts the accepted tokens as a whole output (EOS allowed there)


class _Matchers:
    """llguidance matcher states by (spec, prefix), each copied from its parent's and fed one token (bounded LRU)."""

    def __init__(self, fresh) -> None:
        self.fresh, self.states = fresh, OrderedDict()

    def get(self, key: str, prefix: tuple[int, ...]) -> Any:
        """The state after ``prefix`` (None where the grammar refused one of its tokens)."""
        if (key, prefix) in self.states:
            self.states.move_to_end((key, prefix))
            return self.states[(key, prefix)]
        if not prefix:
            state = self.fresh(key)
        else:
            parent = self.get(key, prefix[:-1])
            state = None if parent is None else parent.deep_copy()
            if state is not None and (not state.consume_token(prefix[-1]) or state.is_error()):
                state = None
        self.states[(key, prefix)] = state
        if len(self.states) > CACHE:
            self.states.popitem(last=False)
        return state


class GrammarReference:
    """llguidance's allowed sets on :func:`token_table`'s table (module docstring)."""

    name = "llguidance"

    def __init__(self, model_path: str) -> None:
        import llguidance
        from transformers import AutoTokenizer

        self.table = token_table(model_path)
        wrapped = _Wrapped(self.table, AutoTokenizer.from_pretrained(model_path))
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapped),
                                                n_vocab=self.table.vocab_size, eos_token=list(self.table.eos))
        self.grammars: dict[str, Any] = {}
        self.matchers = _Matchers(self._fresh)
        self._init_del()
        require_general_escapes(self.tokenizer)

    def _init_del(self) -> None:
        """The DEL tokens, and the "~" token whose being allowed raw marks a free JSON string (``raw_del``)."""
        pieces = self.table.pieces
        self.del_tokens = [i for i, p in enumerate(pieces) if p == b"\x7f"]
        self.tilde = next((i for i, p in enumerate(pieces) if p == b"~"), None)

    def _key(self, structured: dict[str, Any]) -> str:
        key = json.dumps(structured, sort_keys=True, ensure_ascii=False)
        if key not in self.grammars:
            self.grammars[key] = self.compile(structured)
        return key

    def compile(self, structured: dict[str, Any]) -> str:
        import llguidance

        grammar = to_lark(structured, self.table.leading_space)
        error = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise ValueError(f"llguidance refuses {structured}: {error}")
        return grammar

    def _fresh(self, key: str) -> Any:
        import llguidance

        return llguidance.LLMatcher(self.tokenizer, self.grammars[key], log_level=0)


    def allowed(self, structured: dict[str, Any], prefix: list[int], raw_del: bool = False) -> torch.Tensor:
        """(vocab,) bool: the tokens the grammar allows after ``prefix`` (all False after a refused token or an EOS;
        only EOS where the grammar accepts and can go no further, or where nothing it allows can be spelled);
        ``raw_del``: with RFC 8259's DEL in JSON strings (module docstring)."""
        if not raw_del or schema_of(structured) is None or self.tilde is None:
            return self._allowed(structured, prefix)
        mask = self._allowed(structured, [self.tilde if t in self.del_tokens else t for t in prefix])
        if mask[self.tilde]:  # (a DEL in the prefix stands for a raw "~": the same to a free JSON string)
            mask[self.del_tokens] = True
        return mask

    def _allowed(self, structured: dict[str, Any], prefix: list[int]) -> torch.Tensor:
        state = self.matchers.get(self._key(structured), tuple(prefix))
        if state is None or (prefix and prefix[-1] in self.table.eos):  # refused, or ended by an EOS it accepted
            return torch.zeros(self.table.vocab_size, dtype=torch.bool)
        return _dead_end_ends(_bits(np.frombuffer(state.compute_bitmask(), dtype="<u4"), self.table.vocab_size),
                              self.table.eos)

    def walk(self, structured: dict[str, Any], tokens: list[int], raw_del: bool = False) -> Walk:
        """How much of ``tokens`` the grammar accepts, and whether it accepts that as a whole (EOS tokens in
        ``tokens`` count as accepted where the grammar allows them)."""
        n = 0
        while n < len(tokens) and bool(self.allowed(structured, tokens[:n], raw_del)[tokens[n]]):
            n += 1
        accepted = tokens[:n]
        ended = bool(accepted) and accepted[-1] in self.table.eos
        eos_ok = any(bool(self.allowed(structured, accepted, raw_del)[e]) for e in self.table.eos)
        return Walk(n, ended or eos_ok)


class _Wrapped:
    """The token table in the shape llguidance.TokenizerWrapper reads (special tokens marked by their ids; text
    tokenized by the checkpoint's tokenizer, which llguidance only asks for with forcing, off here)."""

    def __init__(self, table: TokenTable, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id, self.bos_token_id = (table.eos or (0,))[0], None
        self.special_token_ids = [i for i, p in enumerate(table.pieces) if p is None]
        self.tokens = [p if p is not None else b"\xff<special_%d>" % i for i, p in enumerate(table.pieces)]

    def __call__(self, text: bytes) -> list[int]:
        return self.tokenizer.encode(text.decode("utf-8", "replace"), add_special_tokens=False)
