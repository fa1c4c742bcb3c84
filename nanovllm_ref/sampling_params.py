"""Per-request sampling parameters: a frozen dataclass validated at construction.

Field names, defaults and semantics follow vLLM's `SamplingParams` so users can switch without surprises
(temperature 0 means greedy; top_k -1 or 0 disables top-k; penalties, min_p, min_tokens, logit_bias, stop
strings, skip_special_tokens, spaces_between_special_tokens and n as in vLLM / the OpenAI API; the text policy:
engine/detokenizer.py). `logprobs_mode` is vLLM's engine-level setting, per request here. `output_kind` (vLLM's
`RequestOutputKind`) says what `LLMEngine.step()` returns for the request: cumulative outputs, deltas, or only the
final output (`LLM.generate` always takes the final one). `structured_outputs` (vLLM's
`StructuredOutputsParams`: a JSON schema, a regex, a choice, a grammar or any JSON object) constrains the output
(nanovllm_ref/structured/). What depends on the model (token ids < vocab size, top_k <= vocab size, stop strings
and structured outputs need a tokenizer: `check_model_limits`; a schema, regex or grammar must compile) is checked
first when the request is added (LLMEngine.validate_request). Every message names the field and its limit.
References: vLLM vllm/sampling_params.py; OpenAI API reference (presence/frequency penalties, logit_bias).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

MAX_LOGPROBS = 20  # vLLM's default max_logprobs; the golden outputs store top-20
MAX_N = 4096
MAX_INT32 = 2**31 - 1
SEED_RANGE = (-(2**63), 2**64)  # torch.Generator.manual_seed's range; stored as int64 (two's complement)
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


class RequestOutputKind(IntEnum):
    """What `LLMEngine.step()` returns for a request (vLLM's names and values)."""

    CUMULATIVE = 0  # every step it advanced in: everything so far
    DELTA = 1  # every step it advanced in: only what is new (the pieces concatenate to the final output)
    FINAL_ONLY = 2  # once, when it finished


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on a request's output, vLLM's `StructuredOutputsParams` fields (exactly one set): `json` a JSON
    schema (a dict, or its JSON text), `regex` a regular expression the whole output matches, `choice` one of the
    strings, `grammar` an EBNF grammar as xgrammar reads it (GBNF, with a `root` rule) or a Lark grammar (no `::=`),
    `json_object` any JSON object. Only the form is checked here; the engine compiles it (an invalid schema, regex
    or grammar raises ValueError naming `structured_outputs.<kind>` then). `key` is the compile cache's key."""

    json: dict | str | None = field(default=None, hash=False)  # (a dict: hashed through `key`)
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    _json_text: str | None = field(default=None, init=False, repr=False, compare=False)  # canonical `json`

    def __post_init__(self) -> None:
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured_outputs.json_object must be a bool, got {self.json_object!r}")
        given = self._given()
        if len(given) != 1:
            raise ValueError(f"structured_outputs: exactly one of {', '.join(STRUCTURED_KINDS)} must be set, got "
                             f"{', '.join(given) or 'none'}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string, got {value!r}")
        if self.choice is not None:
            choice = self.choice
            if not isinstance(choice, (list, tuple)) or not choice or not all(isinstance(c, str) for c in choice):
                raise ValueError(f"structured_outputs.choice must be a non-empty list of strings, got {choice!r}")
            object.__setattr__(self, "choice", tuple(choice))
        if self.json is not None:
            object.__setattr__(self, "_json_text", _schema_text(self.json))

    def _given(self) -> list[str]:
        return [k for k in STRUCTURED_KINDS
                if (self.json_object if k == "json_object" else getattr(self, k) is not None)]

    @property
    def kind(self) -> str:
        """The field that is set: one of STRUCTURED_KINDS."""
        return self._given()[0]

    @property
    def key(self) -> tuple[str, str | tuple[str, ...] | bool]:
        """(kind, value): a JSON schema as its canonical text (its own key order: the order of `properties` is the
        output's), so a schema given as a dict or as text, spaced any way, shares one compilation."""
        kind = self.kind
        return kind, self._json_text if kind == "json" else getattr(self, kind)


def _schema_text(schema: object) -> str:
    """A JSON schema (a dict, or JSON text of an object or a boolean schema) as canonical JSON text (keys kept in
    order)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"structured_outputs.json must be a JSON schema (an object), got {type(schema).__name__}")
    try:
        return json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"structured_outputs.json is not JSON-serializable: {e}") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(name: str, value: object, low: int, high: int | None = None, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if not _is_int(value) or value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an int {limit}, got {value!r}")


def check_bools(obj: object, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(obj, name), bool):
            raise ValueError(f"{name} must be a bool, got {getattr(obj, name)!r}")


def check_number(name: str, value: object, low: float, high: float, low_open: bool = False) -> None:
    if not _is_number(value) or not (low < value if low_open else low <= value) or value > high:
        raise ValueError(f"{name} must be a number in {'(' if low_open else '['}{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True  # in the output text (the token ids always have every token)
    spaces_between_special_tokens: bool = True  # false: no space between two added tokens (special ones kept)
    logit_bias: dict[int, float] | None = field(default=None, hash=False)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logprobs_mode: str = "raw_logprobs"
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        check_int("n", self.n, 1, MAX_N)
        t = self.temperature
        if not _is_number(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if not _is_int(self.top_k) or not (self.top_k in (-1, 0) or 1 <= self.top_k <= MAX_INT32):
            raise ValueError(f"top_k must be an int: -1 or 0 (disabled) or in [1, {MAX_INT32}], got {self.top_k!r}")
        check_number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        check_number("min_p", self.min_p, 0.0, 1.0)
        check_number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        check_number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        check_number("repetition_penalty", self.repetition_penalty, 0.0, 1e4, low_open=True)
        check_int("seed", self.seed, SEED_RANGE[0], SEED_RANGE[1] - 1, none_ok=True)
        check_int("max_tokens", self.max_tokens, 1, MAX_INT32)
        check_int("min_tokens", self.min_tokens, 0, self.max_tokens)
        check_bools(self, "ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                    "spaces_between_special_tokens")
        stop = (self.stop,) if isinstance(self.stop, str) else () if self.stop is None else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a non-empty string or a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(stop))
        stops = self.stop_token_ids
        if not isinstance(stops, (list, tuple)) or not all(_is_int(s) and 0 <= s <= MAX_INT32 for s in stops):
            raise ValueError(f"stop_token_ids must be a list of ints in [0, {MAX_INT32}], got {stops!r}")
        object.__setattr__(self, "stop_token_ids", tuple(stops))
        object.__setattr__(self, "logit_bias", _checked_logit_bias(self.logit_bias))
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and (not _is_int(n) or not 0 <= n <= MAX_LOGPROBS):
                raise ValueError(f"{name} must be None or an int in [0, {MAX_LOGPROBS}], got {n!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if self.output_kind not in tuple(RequestOutputKind) or isinstance(self.output_kind, bool):
            raise ValueError(f"output_kind must be a RequestOutputKind ({', '.join(k.name for k in RequestOutputKind)}"
                             f"), got {self.output_kind!r}")
        object.__setattr__(self, "output_kind", RequestOutputKind(self.output_kind))
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(f"structured_outputs must be a StructuredOutputsParams or None, got "
                             f"{type(self.structured_outputs).__name__}")

    def check_model_limits(self, vocab_size: int, has_tokenizer: bool) -> None:  # see the module docstring
        if self.top_k > vocab_size:
            raise ValueError(f"top_k must be <= the vocabulary size {vocab_size} (-1/0: off), got {self.top_k}")
        for name, ids in (("stop_token_ids", self.stop_token_ids), ("logit_bias", self.logit_bias or ())):
            bad = next((t for t in ids if t >= vocab_size), None)
            if bad is not None:
                raise ValueError(f"{name} has token id {bad}, outside the vocabulary [0, {vocab_size})")
        if self.stop and not has_tokenizer:
            raise ValueError("stop strings need a tokenizer, and the checkpoint has none: use stop_token_ids")
        if self.structured_outputs is not None and not has_tokenizer:
            raise ValueError("structured_outputs need a tokenizer (the grammar reads token texts), and the checkpoint "
                             "has none")

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def needs_logits_processing(self) -> bool:
        """Whether the request's row takes the torch processing path (the fused sampler does the rest); a structured
        request's rows too: each sampling row then has a ProcessedRow, whose tokens the grammar's mask follows."""
        return (self.uses_penalties or self.min_p > 0 or self.min_tokens > 0 or bool(self.logit_bias)
                or self.logprobs_mode != "raw_logprobs" or self.structured_outputs is not None)


def _checked_logit_bias(bias: object) -> dict[int, float] | None:
    """A copy of `bias` ({token id: bias in [-100, 100]}, the OpenAI API's range), or None when empty. Keys may
    be decimal strings, as JSON (the OpenAI API) sends them."""
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a dict {{token id: bias}}, got {type(bias).__name__}")
    bias = {int(t) if isinstance(t, str) and t.isdecimal() and len(t) <= 10 else t: v for t, v in bias.items()}
    for token, value in bias.items():
        if not _is_int(token) or not 0 <= token <= MAX_INT32:
            raise ValueError(f"logit_bias keys must be token ids (ints in [0, {MAX_INT32}]), got {token!r}")
        if not _is_number(value) or not -100 <= value <= 100:
            raise ValueError(f"logit_bias[{token}] must be a number in [-100, 100], got {value!r}")
    return {int(t): float(v) for t, v in bias.items()} or None


class ProcessedRow(NamedTuple):
    """A sampling row that takes the torch processing path (layers/logits_processing.py), and what it reads."""

    row: int  # index among the step's sampling rows
    params: SamplingParams
    token_ids: list[int]  # the sequence's own list (prompt, then output): read, never written
    num_prompt_tokens: int
    stop_ids: frozenset[int]  # EOS and stop_token_ids: masked while the output is shorter than min_tokens
    seq_id: int = -1  # keys the penalty counts kept across steps (-1: none kept)
