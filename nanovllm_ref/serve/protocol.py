"""Request models of the OpenAI API (completions, chat completions) as vLLM's server accepts them.

Pydantic models with `extra="forbid"`: a parameter this server does not know is a 400 naming it, never silently
ignored. Fields follow the OpenAI API reference and vLLM's `entrypoints/openai/protocol.py` (its extensions:
`top_k`, `min_p`, `repetition_penalty`, `min_tokens`, `ignore_eos`, `stop_token_ids`,
`include_stop_str_in_output`, `skip_special_tokens`, `spaces_between_special_tokens`, `prompt_logprobs`,
`return_tokens_as_token_ids`, `structured_outputs`). Structured outputs come as OpenAI's `response_format` (`text`,
`json_object`, `json_schema` with its `schema`) or vLLM's `structured_outputs` (one of `json`, `regex`, `choice`,
`grammar`, `json_object`), on both endpoints.
Values are range-checked later, by `SamplingParams` and the engine, so the messages are the engine's own.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage in every chunk


class JsonSchemaFormat(_Strict):
    """OpenAI's `response_format.json_schema`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(description="the schema's name (recorded nowhere)")
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema", description="the JSON schema the output follows")
    strict: bool | None = Field(None, description="accepted: the output always follows the schema")


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(_Strict):
    """vLLM's `structured_outputs` (SamplingParams.structured_outputs): exactly one of the fields."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    json_schema: dict[str, Any] | str | None = Field(None, alias="json", description="a JSON schema")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = Field(None, description="EBNF (xgrammar's GBNF, `root ::= ...`) or Lark")
    json_object: bool | None = None


class _SamplingRequest(_Strict):
    """What completions and chat share."""

    model: str | None = Field(None, description="a served model name; default: the first one")
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(None, description="an end-user id; recorded nowhere (OpenAI: for abuse monitoring)")
    # vLLM's extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_logprobs: int | None = None
    return_tokens_as_token_ids: bool = False
    structured_outputs: StructuredOutputsRequest | None = None
    response_format: ResponseFormat | None = Field(None, description="OpenAI's: text, json_object or json_schema")


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, description="top logprobs per token (0: the chosen token's only)")
    best_of: int | None = Field(None, description="accepted only equal to n (no server-side ranking)")
    suffix: str | None = Field(None, description="refused: no fill-in-the-middle")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, object] | None = None
