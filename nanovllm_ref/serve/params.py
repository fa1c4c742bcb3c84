"""From an OpenAI request to `SamplingParams` plus what the server itself does around the engine.

Parameters map onto `SamplingParams` by their vLLM names. One that `dataclasses.fields(SamplingParams)` lacks is
refused with a 400 naming it, unless its value is the neutral one (e.g. `presence_penalty: 0`), which is honoured
trivially: so a feature added to the engine is served without an edit here, and none is ever silently ignored.

The server's own part (`RequestPlan`): `echo` prepends the prompt (and its logprobs); usage chunks in streams;
chat without max_tokens fills the context. `n`, stop strings and the text (`skip_special_tokens`) are the
engine's (`SamplingParams`), and so are structured outputs: OpenAI's `response_format` (`json_schema`: its schema;
`json_object`; `text`: none) and vLLM's `structured_outputs` both become `SamplingParams.structured_outputs` (as in
vLLM's protocol.py; both at once is refused), compiled when the engine validates the request.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ..sampling_params import SamplingParams, StructuredOutputsParams
from .protocol import ChatCompletionRequest, CompletionRequest

SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams))
# values that leave sampling unchanged: accepted even where the engine lacks the feature
NEUTRAL: dict[str, Any] = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
                           "min_p": 0.0, "min_tokens": 0, "logit_bias": {}}
MAX_N = 64  # choices per request (the engine allows more; a server bounds the work one request asks for)
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range; larger values are clipped, as vLLM does


class BadRequest(ValueError):
    """A request the server refuses; `status` and `param` go into the OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


@dataclass(frozen=True)
class RequestPlan:
    params: SamplingParams  # n samples per prompt
    echo: bool
    tokens_as_ids: bool
    usage_in_stream: bool
    usage_every_chunk: bool
    fill_max_tokens: bool  # chat without max_tokens: the rest of the context, as vLLM does
    structured_param: str | None = None  # the parameter structured outputs came in: the engine's errors name it

    @property
    def n(self) -> int:
        return self.params.n


def _engine_feature(kwargs: dict, name: str, value: Any) -> None:
    if value is None or (name in NEUTRAL and value == NEUTRAL[name]):
        return
    if name not in SAMPLING_FIELDS:
        raise BadRequest(f"{name}: not supported by this engine (SamplingParams has no {name!r} field)", name)
    kwargs[name] = value


def _logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    if not raw:
        return None
    try:
        return {int(k): max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(v))) for k, v in raw.items()}
    except ValueError:
        raise BadRequest("logit_bias: keys must be token ids (integers as strings)", "logit_bias") from None


def _structured_outputs(req: CompletionRequest | ChatCompletionRequest) -> tuple[StructuredOutputsParams | None, str]:
    """(the request's structured outputs, the parameter they came in)."""
    fmt, so = req.response_format, req.structured_outputs
    if so is not None:
        if fmt is not None and fmt.type != "text":
            raise BadRequest("response_format: give response_format or structured_outputs, not both", "response_format")
        given = {"json": so.json_schema, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
                 "json_object": so.json_object}
        try:
            return StructuredOutputsParams(**{k: v for k, v in given.items() if v is not None}), "structured_outputs"
        except ValueError as e:
            raise BadRequest(str(e), "structured_outputs") from None
    if fmt is None or fmt.type == "text":
        return None, "response_format"
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True), "response_format"
    if fmt.json_schema is None or fmt.json_schema.json_schema is None:
        raise BadRequest("response_format.json_schema.schema: required with type json_schema", "response_format")
    try:
        return StructuredOutputsParams(json=fmt.json_schema.json_schema), "response_format"
    except ValueError as e:
        raise BadRequest(f"response_format: {e}", "response_format") from None


def plan_request(req: CompletionRequest | ChatCompletionRequest) -> RequestPlan:
    """Map the request; raise BadRequest for anything refused (before the engine sees it)."""
    chat = isinstance(req, ChatCompletionRequest)
    kwargs: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "seed", "ignore_eos", "prompt_logprobs"):
        if getattr(req, name) is not None:
            kwargs[name] = getattr(req, name)
    kwargs["stop_token_ids"] = req.stop_token_ids or ()
    max_tokens = req.max_completion_tokens if chat and req.max_completion_tokens is not None else req.max_tokens
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if chat:
        if req.top_logprobs is not None and not req.logprobs:
            raise BadRequest("top_logprobs: needs logprobs=true", "top_logprobs")
        if req.logprobs:
            kwargs["logprobs"] = req.top_logprobs or 0
        if req.continue_final_message and req.add_generation_prompt:
            raise BadRequest("continue_final_message: needs add_generation_prompt=false", "continue_final_message")
    else:
        if req.logprobs is not None:
            kwargs["logprobs"] = req.logprobs
        if req.suffix is not None:
            raise BadRequest("suffix: not supported (no fill-in-the-middle)", "suffix")
        if req.best_of not in (None, req.n):
            raise BadRequest("best_of: only best_of == n is supported (no server-side ranking)", "best_of")
        if req.echo and req.logprobs is not None:  # the prompt's logprobs come with it, as in vLLM
            kwargs["prompt_logprobs"] = max(kwargs.get("prompt_logprobs") or 0, req.logprobs)
    for name in ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens"):
        _engine_feature(kwargs, name, getattr(req, name))
    _engine_feature(kwargs, "logit_bias", _logit_bias(req.logit_bias))
    structured, structured_param = _structured_outputs(req)
    _engine_feature(kwargs, "structured_outputs", structured)
    kwargs.update(stop=req.stop or (), include_stop_str_in_output=req.include_stop_str_in_output,
                  skip_special_tokens=req.skip_special_tokens,
                  spaces_between_special_tokens=req.spaces_between_special_tokens)
    if not 1 <= req.n <= MAX_N:
        raise BadRequest(f"n must be in [1, {MAX_N}], got {req.n}", "n")
    kwargs["n"] = req.n
    if req.stream_options is not None and not req.stream:
        raise BadRequest("stream_options: only with stream=true", "stream_options")
    try:
        params = SamplingParams(**kwargs)
    except (ValueError, TypeError) as e:
        name = re.match(r"\w*", str(e)).group()  # SamplingParams' messages begin with the field's name
        raise BadRequest(str(e), name if name in kwargs else None) from None
    options = req.stream_options or None
    return RequestPlan(
        params=params, echo=(not chat) and req.echo, tokens_as_ids=req.return_tokens_as_token_ids,
        usage_in_stream=bool(options and (options.include_usage or options.continuous_usage_stats)),
        usage_every_chunk=bool(options and options.continuous_usage_stats),
        fill_max_tokens=chat and max_tokens is None, structured_param=structured_param if structured else None,
    )
