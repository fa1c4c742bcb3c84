"""The engine loop: one thread owns the engine (add, abort, step); requests await its results on asyncio queues.

Commands (add, abort) go in through a thread-safe queue and are applied between steps, so an abort lands before
the next step: a request whose client went away consumes at most the step already running. Requests run with
DELTA outputs (SamplingParams.output_kind): after each step, every unfinished sample (of a request's n) that
advanced gets a `Delta` (its index, tokens, their logprobs and its new text, text that can no longer change) on the
request's asyncio queue, and a finished request its whole `RequestOutput` (the deltas joined, all n samples; a
sample that finished earlier gets its last tokens there, after its stop string was applied). An exception that
escapes a step (the engine already fails just the requests of a step that raises) ends the loop: every waiting
request gets the error and `/health` turns 503.

The loop also tells a `LoopObserver` (the server's metrics) what happened: after every step the scheduler's load,
each request's first token (time to first token, its prompt tokens), new tokens, and each finished request.
Only the engine's public API is used (step outputs, stats(), add/abort).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass

from ..llm import LLM
from ..outputs import RequestOutput
from ..sampling_params import RequestOutputKind, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Delta:
    index: int  # the sample (of n)
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    prompt_logprobs: list[dict[int, float] | None] | None = None  # with the first delta (the prompt is done)
    text: str = ""  # the sample's new text that can no longer change (its DELTA output's)


@dataclass
class Failed:
    message: str


def engine_stats(llm: LLM) -> dict[str, float]:
    """Scheduler and KV-cache load now (engine thread only; LLMEngine.stats()): running and waiting sequences, the
    cache's used fraction (blocks neither free nor only kept for the prefix cache, as vLLM counts it) and the
    preemptions so far."""
    return dataclasses.asdict(llm.stats())


class LoopObserver:
    """What the engine loop reports (all calls from the engine thread; times from time.monotonic()). This base
    ignores everything; the server's metrics (metrics.py) record it."""

    def on_step(self, stats: dict[str, float]) -> None:
        """After each step, and at least every 0.5 s when idle: engine_stats()."""

    def on_first_token(self, num_prompt_tokens: int, ttft_s: float) -> None:
        """A request's prefill is done: its first output token exists, `ttft_s` after it arrived."""

    def on_tokens(self, num_tokens: int) -> None:
        """New output tokens (all samples of all requests) since the last call."""

    def on_finished(self, out: RequestOutput, arrival: float, first_token: float | None, now: float) -> None:
        """A request ended (any finish reason)."""


class _Stream:
    """Where one request's items go: (request id, item) on an asyncio queue, put from the engine thread."""

    __slots__ = ("rid", "inbox", "loop", "joined", "arrival", "first_token")

    def __init__(self, rid: str, inbox: asyncio.Queue, loop: asyncio.AbstractEventLoop) -> None:
        self.rid, self.inbox, self.loop = rid, inbox, loop
        self.joined: RequestOutput | None = None  # the request's DELTA outputs so far, joined
        self.arrival, self.first_token = time.monotonic(), None

    def join(self, out: RequestOutput) -> RequestOutput:
        if self.joined is None:
            self.joined = RequestOutput(out.request_id, out.prompt_token_ids)
        self.joined.add(out, aggregate=True)
        return self.joined

    def put(self, item: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.inbox.put_nowait, (self.rid, item))
        except RuntimeError:  # the event loop is closed (server shutting down)
            pass


class EngineLoop(threading.Thread):
    def __init__(self, llm: LLM, observer: LoopObserver | None = None) -> None:
        super().__init__(daemon=True, name="nanovllm_ref-engine")
        self.llm = llm
        self.observer = observer or LoopObserver()
        self.fatal: str | None = None  # why the loop died, if it did
        self.num_steps = 0
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._ids = itertools.count()
        self._stopping = False
        self._death = threading.Lock()  # a request is either queued before the loop dies (and failed) or refused

    @property
    def healthy(self) -> bool:
        return self.is_alive() and self.fatal is None

    def validate(self, token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError/TypeError as the engine would on add (reads only what never changes)."""
        self.llm.engine.validate_request(token_ids, params)

    def submit(self, token_ids: list[int], params: SamplingParams, inbox: asyncio.Queue) -> str:
        """Queue a validated request; (its id, Delta / RequestOutput / Failed) items arrive on `inbox`."""
        rid = f"req-{next(self._ids)}"
        with self._death:
            if not self.healthy:
                raise RuntimeError(f"the engine loop is not running: {self.fatal or 'stopped'}")
            self._commands.put(("add", rid, token_ids, params, _Stream(rid, inbox, asyncio.get_running_loop())))
        return rid

    def abort(self, rid: str) -> None:
        self._commands.put(("abort", rid))

    def stop(self) -> None:
        self._stopping = True
        self._commands.put(("wake",))

    def active_request_ids(self) -> set[str]:
        """The engine's unfinished requests: those added and neither finished nor aborted (read from another thread:
        retried if the dict changes meanwhile)."""
        while True:
            try:
                return set(self._streams)
            except RuntimeError:
                continue

    def run(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands(block=not self.llm.has_unfinished())
                if self.llm.has_unfinished():
                    outputs = self.llm.step()
                    self.num_steps += 1
                    self._deliver(outputs)
                self.observer.on_step(engine_stats(self.llm))
        except BaseException as e:  # an engine bug: say so to everyone waiting, and let /health tell
            log.exception("the engine loop died")
            with self._death:
                self.fatal = f"{type(e).__name__}: {e}"
            failed = Failed(f"the engine loop died: {self.fatal}")
            for stream in self._streams.values():
                stream.put(failed)
            self._streams.clear()
            while not self._commands.empty():  # requests queued but never added would wait forever
                command = self._commands.get()
                if command[0] == "add":
                    command[-1].put(failed)

    def _apply_commands(self, block: bool) -> None:
        try:
            while True:
                command = self._commands.get(block=block, timeout=0.5 if block else None)
                block = False
                if command[0] == "add":
                    self._add(*command[1:])
                elif command[0] == "abort" and command[1] in self._streams:
                    out = self.llm.abort_request(command[1])
                    stream = self._streams.pop(command[1])
                    if out is not None:
                        self.observer.on_finished(stream.join(out), stream.arrival, stream.first_token,
                                                  time.monotonic())
        except queue.Empty:
            pass

    def _add(self, rid: str, token_ids: list[int], params: SamplingParams, stream: _Stream) -> None:
        try:
            params = dataclasses.replace(params, output_kind=RequestOutputKind.DELTA)
            self.llm.engine.add_validated(token_ids, params, request_id=rid)  # (`validate` checked it)
        except (ValueError, TypeError) as e:
            stream.put(Failed(str(e)))
            return
        self._streams[rid] = stream

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Pass on a step's DELTA outputs: Deltas for the samples that go on, the joined output once finished."""
        now, num_new = time.monotonic(), 0
        for out in outputs:  # (those still running come first)
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            before = {c.index: len(c.token_ids) for c in stream.joined.outputs} if stream.joined else {}
            joined = stream.join(out)
            num_new += sum(len(c.token_ids) for c in out.outputs)
            if any(c.token_ids for c in joined.outputs):
                self._first_token(stream, len(out.prompt_token_ids), now)
            if not out.finished:
                for c in out.outputs:  # (a finished sample: the request's final output tells the rest)
                    if c.token_ids and not c.finished:
                        prompt_logprobs = joined.prompt_logprobs if not before.get(c.index) else None
                        stream.put(Delta(c.index, c.token_ids, c.logprobs, prompt_logprobs, c.text))
                continue
            del self._streams[out.request_id]  # (observed before it is put: a client that has its response finds
            self.observer.on_tokens(num_new)  # it counted)
            num_new = 0
            self.observer.on_finished(joined, stream.arrival, stream.first_token, now)
            stream.put(joined)
        if num_new:
            self.observer.on_tokens(num_new)

    def _first_token(self, stream: _Stream, num_prompt_tokens: int, now: float) -> None:
        if stream.first_token is None:
            stream.first_token = now
            self.observer.on_first_token(num_prompt_tokens, now - stream.arrival)
