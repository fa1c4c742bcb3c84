"""Request-level engine calls: per-request sampling settings, finish reasons and text (optional for adapters).

The greedy ``EngineAdapter.generate`` call is all that ``test_golden`` needs. Cases that compare what a
request *does* (stops on EOS or a stop token, several logprobs counts in one batch, sampling settings, ``n``)
need each request's own settings. An adapter that implements ``run_requests`` takes part in them; one that
does not is skipped there with the reason, and still runs every greedy case.

Settings use vLLM's ``SamplingParams`` names (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed``,
``max_tokens``, ``ignore_eos``, ``stop_token_ids``, ``stop``, ``logprobs``, ``prompt_logprobs``, ``n``,
``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``min_tokens``, ``logit_bias``, ...), so
an adapter for vLLM passes them through unchanged. An engine that does not support a setting raises
:class:`UnsupportedSetting` naming it; the case that needs it is then skipped with that message, never passed.

Structured outputs (optional, conformance/test_structured.py): the setting ``structured_outputs`` is a dict with
exactly one of vLLM's ``StructuredOutputsParams`` keys (``json``: a JSON schema, dict or str; ``regex``; ``choice``: a
list of strings; ``grammar``: an EBNF grammar; ``json_object``: true). The nanovllm_ref and vllm adapters build their
engine's ``StructuredOutputsParams`` from it, the OpenAI adapter sends it as vLLM's extra body ``structured_outputs``
(or, with ``structured_route="response_format"``, a JSON schema as OpenAI's ``response_format``); an adapter that
cannot honour it raises :class:`UnsupportedSetting`.

Text capabilities (optional, conformance/test_text.py): a completion's ``text`` (None: the engine returns none)
and ``stop_reason`` (:data:`UNREPORTED` unless the engine reports it); ``stream_requests`` (the same requests,
streamed: each completion with the text pieces in the order the engine sent them). An adapter without one has the
cases that need it skipped with the reason.

Abort (optional, conformance/test_abort.py): ``abort_requests(requests, after_steps)`` adds the requests
together, runs ``after_steps`` engine steps, aborts every unfinished request and returns each one's completions
(an aborted sample's ``finish_reason`` is ``"abort"``, vLLM's), None where the abort returned no output.

Cached tokens (optional): a completion's ``num_cached_tokens`` is the prompt tokens the engine's prefix cache
served (None: not reported). The prefix-cache accounting cases (conformance/test_prefix_cache.py) also need the
adapter's factory to have ``prefix_cache_kwargs(block_size, num_blocks, max_model_len) -> dict``, the factory
kwargs of a cache of ``num_blocks`` usable blocks with prefix caching on (nanovllm_ref and vllm have it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

LogprobDict = dict[int, float]


class UnsupportedSetting(Exception):
    """The engine cannot honour a request setting (the message names it)."""


class _Unreported:
    def __repr__(self) -> str:
        return "UNREPORTED"


UNREPORTED: Any = _Unreported()  # the stop_reason of a completion whose engine does not report one


@dataclass(frozen=True)
class RequestSpec:
    """One request: a token-id prompt and its settings (vLLM ``SamplingParams`` keyword names)."""

    prompt: list[int]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Completion:
    """One completion of a request (a request with ``n`` > 1 has n of them).

    Attributes:
        token_ids: generated tokens, the stop token included when the request stopped on one (vLLM's
            ``token_ids`` also keep a stop token id; a stop *string* is trimmed from ``text`` only).
        finish_reason: ``"stop"`` (EOS, a stop token or a stop string) or ``"length"`` (max_tokens or
            max_model_len).
        logprobs: per generated token ``{token_id: logprob}`` (top-``logprobs`` plus the sampled token), or
            None when not asked for.
        prompt_logprobs: as in :class:`~nanovllm_ref.oracle.compare.EngineOutput`, or None.
        text: the detokenized output, when the engine has a tokenizer for the checkpoint.
        stop_reason: what ended a ``"stop"`` (vLLM's field): the stop string, the stop token id, None for EOS
            (and for ``"length"``); :data:`UNREPORTED` when the engine does not say.
    """

    token_ids: list[int]
    finish_reason: str
    logprobs: list[LogprobDict] | None = None
    prompt_logprobs: list[LogprobDict | None] | None = None
    num_cached_tokens: int | None = None
    text: str | None = None
    stop_reason: int | str | None = UNREPORTED


@dataclass
class StreamedCompletion:
    """One completion of a streamed request: its final state and the text pieces as they arrived."""

    completion: Completion
    pieces: list[str] = field(default_factory=list)


@runtime_checkable
class RequestEngine(Protocol):
    """An adapter that also runs requests with their own settings, all submitted together (one batch)."""

    def run_requests(self, requests: list[RequestSpec]) -> list[list[Completion]]:
        """One list of completions per request, in order (length ``params.get("n", 1)``)."""
        ...


def supports_requests(adapter: object) -> bool:
    return callable(getattr(adapter, "run_requests", None))


def supports_abort(adapter: object) -> bool:
    """Whether the adapter has ``abort_requests(requests, after_steps) -> list[list[Completion] | None]``."""
    return callable(getattr(adapter, "abort_requests", None))


def supports_streaming(adapter: object) -> bool:
    """Whether the adapter has ``stream_requests(requests) -> list[list[StreamedCompletion]]``."""
    return callable(getattr(adapter, "stream_requests", None))
