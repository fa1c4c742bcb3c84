"""What `LLM.generate` returns: one `RequestOutput` per request, in input order; `outputs` holds its n samples
(vLLM's shape), and the request's own fields repeat sample 0 (the whole story when n = 1)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it (None for EOS/length)
    logprobs: list[dict[int, float]] | None = None
    error: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    logprobs: list[dict[int, float]] | None = None  # one dict per generated token: top-k + chosen
    prompt_logprobs: list[dict[int, float] | None] | None = None  # None for the first prompt token
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # why the request ended with finish_reason "error"
    stop_reason: int | str | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)  # the n samples, in order

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
