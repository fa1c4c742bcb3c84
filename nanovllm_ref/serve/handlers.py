"""Completions and chat completions: prompts in, choices out (whole responses or server-sent event streams).

Each choice is one engine request; a response's choices share one asyncio queue that the engine loop fills.
A client that disconnects gets its requests aborted before the engine's next step (streams: when the event
generator is cancelled; whole responses: a watcher on the connection). Response shapes follow the OpenAI API
and vLLM's extensions (`token_ids` and `prompt_logprobs` on completion choices).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .engine_loop import Delta, EngineLoop, Failed
from .params import SAMPLING_FIELDS, BadRequest, RequestPlan
from .text import TextStream


@dataclass
class Choice:
    index: int
    prompt_ids: list[int]
    text: TextStream
    rid: str = ""
    logprobs: list[dict[int, float]] | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    finish_reason: str | None = None
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served
    sent_tokens: int = 0  # tokens already shown in a stream chunk

    @property
    def token_ids(self) -> list[int]:
        return self.text.ids

    def absorb(self, item: Delta | RequestOutput | Failed, loop: EngineLoop) -> str:
        """Apply one engine item; returns the new text. Sets finish_reason when the choice is done."""
        if isinstance(item, Failed):
            self.error, self.finish_reason = item.message, "error"
            return ""
        new = item.token_ids if isinstance(item, Delta) else item.token_ids[len(self.text.ids):]
        if item.logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(item.logprobs[-len(new):] if new else [])
        if isinstance(item, RequestOutput) and item.finish_reason == "stop" and not self.text.detect:
            self.finish_reason, self.num_cached_tokens = "stop", item.num_cached_tokens
            return self.text.settle(new, item.text)  # the engine stopped on a stop string (or a stop token)
        text = self.text.add(new)
        if item.prompt_logprobs is not None:
            self.prompt_logprobs = item.prompt_logprobs
        if isinstance(item, RequestOutput):
            self.num_cached_tokens = item.num_cached_tokens
            if item.finish_reason == "error":
                self.error = item.error or "the engine failed this request"
            self.finish_reason = "stop" if self.text.stopped else item.finish_reason
            return text + self.text.finish()
        if self.text.stopped:  # a stop string the engine does not know about: the server ends the request
            loop.abort(self.rid)
            self.finish_reason = "stop"
            return text + self.text.finish()
        return text

    def finished_logprobs(self) -> list[dict[int, float]] | None:
        return None if self.logprobs is None else self.logprobs[: len(self.text.ids)]


class Generation:
    """The engine requests of one HTTP request."""

    def __init__(self, loop: EngineLoop, tokenizer: Any, plan: RequestPlan, prompts: list[list[int]]) -> None:
        self.loop, self.plan, self.prompts = loop, plan, prompts
        self.inbox: asyncio.Queue = asyncio.Queue()
        engine_stops = "stop" in SAMPLING_FIELDS  # then the engine ends requests on stop strings, min_tokens aware
        self.choices = [Choice(p * plan.n + i, ids, TextStream(tokenizer, plan.stop, plan.include_stop_str,
                                                                plan.skip_special_tokens, detect=not engine_stops))
                        for p, ids in enumerate(prompts) for i in range(plan.n)]
        self.by_rid: dict[str, Choice] = {}
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

    def params(self, prompt_ids: list[int], i: int) -> SamplingParams:
        params = self.plan.choice_params(i)
        if self.plan.fill_max_tokens:
            max_len = self.loop.llm.engine.spec.max_model_len
            params = dataclasses.replace(params, max_tokens=max(1, max_len - len(prompt_ids)))
        return params

    def start(self) -> None:
        """Validate every request (BadRequest names the problem), then submit them all."""
        for ids in self.prompts:
            try:
                self.loop.validate(ids, self.params(ids, 0))
            except (ValueError, TypeError) as e:  # the engine's messages begin with the field's name
                name = str(e).split(" ", 1)[0].split("=")[0].rstrip(":")
                raise BadRequest(str(e), name if name in SAMPLING_FIELDS else "prompt") from None
        for choice in self.choices:
            params = self.params(choice.prompt_ids, choice.index % self.plan.n)
            try:
                choice.rid = self.loop.submit(choice.prompt_ids, params, self.inbox)
            except RuntimeError as e:  # the engine loop is dead
                self.abort_unfinished()
                raise BadRequest(str(e), status=503) from None
            self.by_rid[choice.rid] = choice

    def abort_unfinished(self) -> None:
        for choice in self.choices:
            if choice.finish_reason is None and choice.rid:
                self.loop.abort(choice.rid)

    @property
    def done(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)

    async def events(self) -> AsyncIterator[tuple[Choice, str]]:
        """(choice, new text) as engine items arrive, until every choice is finished."""
        while not self.done:
            rid, item = await self.inbox.get()
            choice = self.by_rid[rid]
            if choice.finish_reason is None:
                yield choice, choice.absorb(item, self.loop)

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
