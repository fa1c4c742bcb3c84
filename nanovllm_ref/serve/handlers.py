"""Completions and chat completions: prompts in, choices out (whole responses or server-sent event streams).

Each prompt is one engine request with the request's `n` (the engine's samples share the prompt's blocks; sample
i of a seeded request samples with seed + i); a response's requests share one asyncio queue that the engine loop
fills. Each choice streams the text pieces of the engine's DELTA outputs (`LLMEngine.step`: never a split
character, a possible stop string held back) and ends with the rest of the engine's final text. A client
that disconnects gets its requests aborted before the engine's next step (streams: when the event generator is
cancelled; whole responses: a watcher on the connection). Response shapes follow the OpenAI API and vLLM's
extensions (`token_ids` and `prompt_logprobs` on completion choices).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .engine_loop import Delta, EngineLoop, Failed
from .params import SAMPLING_FIELDS, BadRequest, RequestPlan

log = logging.getLogger(__name__)


@dataclass
class Choice:
    index: int
    sample: int  # which of its engine request's n samples
    prompt_ids: list[int]
    rid: str = ""
    text: str = ""  # sent so far (all of it once finished)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's field: the stop string or stop token id (None: EOS, length)
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served
    sent_tokens: int = 0  # tokens already shown in a stream chunk

    def absorb(self, item: Delta | RequestOutput | Failed) -> str:
        """Apply one engine item; returns the new text. Sets finish_reason when the choice is done."""
        if isinstance(item, Failed):
            self.error, self.finish_reason = item.message, "error"
            return ""
        if item.prompt_logprobs is not None:
            self.prompt_logprobs = item.prompt_logprobs
        if isinstance(item, Delta):
            self.token_ids += item.token_ids
            if item.logprobs is not None:
                self.logprobs = (self.logprobs or []) + item.logprobs
            return self._send(item.text)
        out = item.outputs[self.sample]
        self.token_ids, self.logprobs = list(out.token_ids), out.logprobs
        self.num_cached_tokens, self.finish_reason = item.num_cached_tokens, out.finish_reason
        self.stop_reason = out.stop_reason
        if out.finish_reason == "error":
            self.error = out.error or item.error or "the engine failed this request"
        if out.text.startswith(self.text):  # the engine's pieces are prefixes of its final text: always so
            return self._send(out.text[len(self.text):])
        log.error("choice %d: the engine's text %r does not extend the streamed text %r", self.index, out.text,
                  self.text)
        return ""

    def _send(self, piece: str) -> str:
        self.text += piece
        return piece

    def finished_logprobs(self) -> list[dict[int, float]] | None:
        return None if self.logprobs is None else self.logprobs[: len(self.token_ids)]


class Generation:
    """The engine requests of one HTTP request: one per prompt, with the request's n samples."""

    def __init__(self, loop: EngineLoop, tokenizer: Any, plan: RequestPlan, prompts: list[list[int]]) -> None:
        self.loop, self.plan, self.prompts = loop, plan, prompts
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.choices = [Choice(p * plan.n + i, i, ids) for p, ids in enumerate(prompts) for i in range(plan.n)]
        self.by_rid: dict[str, list[Choice]] = {}
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def params(self, prompt_ids: list[int]) -> SamplingParams:
        if not self.plan.fill_max_tokens:
            return self.plan.params
        max_len = self.loop.llm.engine.spec.max_model_len
        return dataclasses.replace(self.plan.params, max_tokens=max(1, max_len - len(prompt_ids)))

    def start(self) -> None:
        """Validate every request (BadRequest names the problem), then submit them all."""
        params = []
        for ids in self.prompts:
            try:
                params.append(self.params(ids))
                self.loop.validate(ids, params[-1])
            except (ValueError, TypeError) as e:  # the engine's messages begin with the field's name
                raise self._refused(e) from None
        for p, (ids, prompt_params) in enumerate(zip(self.prompts, params)):
            choices = self.choices[p * self.plan.n:(p + 1) * self.plan.n]
            try:
                rid = self.loop.submit(ids, prompt_params, self.inbox)
            except RuntimeError as e:  # the engine loop is dead
                self.abort_unfinished()
                raise BadRequest(str(e), status=503) from None
            for choice in choices:
                choice.rid = rid
            self.by_rid[rid] = choices

    def _refused(self, e: Exception) -> BadRequest:
        """The engine's refusal, naming the parameter (structured outputs: the one they came in)."""
        name = str(e).split(" ", 1)[0].split("=")[0].rstrip(":")
        if name.split(".")[0] == "structured_outputs" and self.plan.structured_param == "response_format":
            return BadRequest(f"response_format: {e}", "response_format")
        return BadRequest(str(e), name if name.split(".")[0] in SAMPLING_FIELDS else "prompt")

    def abort_unfinished(self) -> None:
        for rid, choices in self.by_rid.items():
            if any(c.finish_reason is None for c in choices):
                self.loop.abort(rid)

    @property
    def done(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    async def events(self) -> AsyncIterator[tuple[Choice, str]]:
        """(choice, new text) as engine items arrive, until every choice is finished."""
        while not self.done:
            rid, item = await self.inbox.get()
            choices = self.by_rid[rid]
            for choice in [choices[item.index]] if isinstance(item, Delta) else choices:
                if choice.finish_reason is None:
                    yield choice, choice.absorb(item)

    def usage(self) -> dict[str, Any]:
        """Prompts count once each (not once per choice), as in vLLM; cached: the first choice's of each."""
        prompt = sum(len(p) for p in self.prompts)
        completion = sum(len(c.token_ids) for c in self.choices)
        cached = sum(c.num_cached_tokens for c in self.choices[:: self.plan.n])
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def raise_if_failed(self) -> None:
        failed = next((c for c in self.choices if c.error is not None), None)
        if failed is not None:
            raise BadRequest(f"generation failed: {failed.error}", status=500)


async def run_to_end(gen: Generation, receive: Any) -> None:
    """Collect every choice; abort them all if the client disconnects first."""
    async def drain() -> None:
        async for _ in gen.events():
            pass

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    work, watch = asyncio.ensure_future(drain()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            gen.abort_unfinished()
    if work.done() and not work.cancelled():
        work.result()


async def sse(gen: Generation, chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Server-sent events; the engine requests are aborted if the client goes away mid-stream."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, allow_nan=False)}\n\n"
        yield "data: [DONE]\n\n"
    finally:  # also on cancellation (client disconnect): nothing awaits here
        gen.abort_unfinished()


def error_event(message: str) -> dict:
    return {"error": {"message": message, "type": "InternalServerError", "code": 500}}
