"""Async scheduling: the overlapped engine loop, and everything it needs beside the synchronous step.

While the device runs a step, the host schedules the step behind it, prepares its inputs and launches it before the
first one's tokens are read back, so the host's update, scheduling and input preparation overlap the forward instead
of idling the device between steps (vLLM v1's AsyncScheduler and async scheduling in its GPU model runner,
mini-sglang's overlap loop, SGLang's overlap scheduler). `Config.async_scheduling`: by default on CUDA only, where
launch and compute overlap; also under tensor parallelism. Three pieces:

- OverlapScheduler, the placeholder accounting: a sequence that the step in flight samples counts one token more than
  its token_ids hold (`num_tokens`), so the step behind computes that token. The step in flight is counted as computed
  when the step behind is scheduled (Scheduler.count_computed) and takes its tokens when they come
  (Scheduler.take_tokens): the halves of the scheduler's one `update`, nothing of its rules copied here.
- gather_rows: where each input id of the step behind comes from on the device: the host's ids for the tokens it knows,
  the step in flight's sampled tokens (its device token buffer, Launched.tokens) for the others, matched by sequence
  (the step behind orders its rows its own way: rows that finished in flight are gone, new and preempted rows come in).
- Overlap, the loop: launch the step, schedule and launch the one behind it, then wait for the first and apply it.
  Only steps the device samples alone are launched behind another (no logprobs, no logits processing, structured
  outputs included: vLLM leaves these out too); one that is not waits until the tokens it continues from are known
  (a grammar's bitmask follows them). A row that finishes in the step in flight computes one more token in the step
  behind, which is dropped (as vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .inputs import StepInput, prepare_step
from .model_runner import Launched
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence

if TYPE_CHECKING:
    from ..outputs import RequestOutput
    from .llm_engine import LLMEngine


class OverlapScheduler(Scheduler):
    """The Scheduler, with the tokens that the step in flight samples counted as the sequences' next tokens."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight: set[Sequence] = set()  # sequences whose next token the step in flight samples
        self.counted: SchedulerOutput | None = None  # that step: computed already, its tokens still to come

    def num_tokens(self, seq: Sequence) -> int:
        return seq.num_tokens + (seq in self.in_flight)

    def take_in_flight(self, out: SchedulerOutput) -> None:
        """Count `out` (launched, its tokens not known) as done, so the step behind it can be scheduled."""
        # (samples reads the computed count: before it is advanced)
        self.in_flight.update(seq for seq, n in out.scheduled if not seq.is_finished and out.samples(seq, n))
        self.count_computed(out)
        self.counted = out

    def update(self, out: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        if out is not self.counted:  # a step nothing was scheduled behind
            return super().update(out, sampled)
        self.counted = None
        self.in_flight.clear()
        return self.take_tokens(out, sampled)

    def finish(self, seq: Sequence, reason: str) -> None:
        super().finish(seq, reason)
        self.in_flight.discard(seq)  # its step in flight failed or was aborted: that token never comes

    def forget_in_flight(self) -> None:
        """The step in flight failed: none of its tokens comes."""
        self.in_flight.clear()
        self.counted = None


def device_samples_alone(step: StepInput) -> bool:
    """Whether `step` may run without the host sampling it: logprobs need the logits there, penalties and other
    logits processing every token."""
    return max(step.num_logprobs, default=-1) < 0 and not step.processed and not step.prompt_logprobs


def gather_rows(out: SchedulerOutput, step: StepInput, in_flight: StepInput) -> np.ndarray | None:
    """For `step` (scheduled as `out` while `in_flight` runs): each token row's input id as an index into the host's
    ids (step.input_ids) followed by `in_flight`'s sampled tokens; None when the host knows them all. A row past a
    sequence's known tokens is the last of its chunk, and its token is the one `in_flight` samples for it."""
    row_of = {seq_id: i for i, seq_id in enumerate(in_flight.sample_seq_ids)}
    fed = [(end - 1, row_of[seq.seq_id]) for (seq, n), end in zip(out.scheduled, step.query_start_loc[1:])
           if seq.num_computed_tokens + n > len(seq.token_ids)]
    if not fed:
        return None
    dst, src = zip(*fed)
    num_known = len(step.input_ids)
    if not num_known:  # every row fed (decodes only): the sampled tokens' rows are the index
        return np.array(src, np.int64)
    dst = np.array(dst, np.int64)  # (a tuple would index dimensions)
    is_fed = np.zeros(step.num_tokens, np.int64)
    is_fed[dst] = 1
    rows = np.arange(step.num_tokens) - (np.cumsum(is_fed) - is_fed)  # the host's ids: in order, skipping fed rows
    rows[dst] = num_known + np.array(src, np.int64)
    return rows


class Overlap:
    """The engine's step under async scheduling (LLMEngine._step's overlapped twin)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        # the step scheduled behind the one in flight; Launched None: it samples on the host, and runs once the tokens
        # it continues from are known
        self.ahead: tuple[SchedulerOutput, Launched | None] | None = None

    def step(self) -> list[RequestOutput]:
        """Launch the step (unless it was launched behind the previous one), schedule and launch the one behind it,
        then wait for the first and apply it."""
        engine = self.engine
        out, launched = self._next_step()
        if launched is None:
            if not out.scheduled:
                return []
            launched = engine.runner.launch(engine._prepare(out))
        if device_samples_alone(launched.step):
            self.ahead = self._launch_behind(out, launched)
        finished = engine._apply(out, engine.runner.collect(launched))
        self.drop_ahead_if_done()
        return finished

    def _next_step(self) -> tuple[SchedulerOutput, Launched | None]:
        """The step scheduled behind the previous one (if it was not launched, without the rows that finished since),
        else a newly scheduled one."""
        if self.ahead is None:
            return self.engine._schedule(), None
        (out, launched), self.ahead = self.ahead, None
        if launched is None:
            out.scheduled = [(seq, n) for seq, n in out.scheduled if not seq.is_finished]
        self.engine._stepping.append(out)
        return out, launched

    def _launch_behind(self, out: SchedulerOutput, launched: Launched,
                       ) -> tuple[SchedulerOutput, Launched | None] | None:
        """With `out` in flight, the step behind it: scheduled now and, if the device samples it alone, launched, its
        rows continuing from `out` gathering their input ids from `launched`'s tokens on the device."""
        engine, scheduler = self.engine, self.engine.scheduler
        scheduler.take_in_flight(out)
        ahead = scheduler.schedule()
        if not ahead.scheduled:
            return None
        engine._stepping.append(ahead)
        step = prepare_step(ahead, engine.config.kvcache_block_size)
        if not device_samples_alone(step):  # (prepared again, grammar bitmask included, once its tokens are known)
            return ahead, None
        rows = gather_rows(ahead, step, launched.step)
        return ahead, engine.runner.launch(step, None if rows is None else launched, rows)

    def drop_ahead_if_done(self) -> None:
        """Forget the step scheduled ahead once every row of it has finished: nothing of it is to be applied."""
        if self.ahead is not None and all(seq.is_finished for seq, _ in self.ahead[0].scheduled):
            if self.ahead[1] is not None:
                self.engine.runner.collect(self.ahead[1])
            self.ahead = None

    def reset(self) -> None:
        """The step failed (its requests are failed): nothing it scheduled stays in flight."""
        self.ahead = None
        self.engine.scheduler.forget_in_flight()
