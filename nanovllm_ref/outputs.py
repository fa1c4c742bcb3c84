"""What `LLM.generate` returns: one `RequestOutput` per request, in input order."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
