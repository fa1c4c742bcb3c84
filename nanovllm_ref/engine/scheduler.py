"""Token-budget continuous batching (vLLM v1 style), pure Python.

Each step grants every scheduled sequence a number of new tokens within `max_num_batched_tokens`: running
sequences first (a decode is 1 token, an unfinished prefill chunk more), then waiting ones in arrival order
(FCFS: the oldest waiting request is never skipped for a younger one). When blocks run out, the newest
running sequence is preempted: its blocks are freed and it is recomputed later from its tokens, so its
output is unaffected. Nothing here asserts: a request that could never fit is refused before it is added
(`check_fits`).
Every step, decodes included, takes this one path: a step's inputs are derived from the sequences (inputs.py).
`schedule_ahead` schedules the step behind the one in flight for the engine's async scheduling (vLLM v1's async
scheduling): the step in flight is taken as done, its sampled tokens pending (known on the device only, which the
step behind reads there) until `update` brings them.
`observers` (registered through `LLMEngine.add_observer`; none by default) get every `schedule()`'s decision as
plain data (observers.py), so tests can check each one against the invariants above
(nanovllm_ref/oracle/schedule_check.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .block_manager import BlockManager
from .observers import schedule_decision
from .sequence import Sequence, SequenceStatus


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, num_new_tokens)
    preempted: list[Sequence] = field(default_factory=list)
    advanced: bool = False  # taken as done while in flight (schedule_ahead): its tokens are pending

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def samples(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether this step ends at the sequence's last known token, i.e. yields a next token."""
        return seq.num_computed_tokens + num_new_tokens == seq.num_tokens


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.observers: list[Any] = []  # each with on_schedule(ScheduleDecision)

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raise ValueError if a request of this size could never run, whatever else is going on."""
        need = num_prompt_tokens + max_tokens
        if need > self.max_model_len:
            raise ValueError(
                f"prompt ({num_prompt_tokens} tokens) + max_tokens ({max_tokens}) = {need} exceeds "
                f"max_model_len={self.max_model_len}"
            )
        bm = self.block_manager
        if bm.blocks_needed(need) > bm.num_blocks:
            raise ValueError(
                f"prompt + max_tokens = {need} tokens needs {bm.blocks_needed(need)} KV blocks of "
                f"{bm.block_size}, but the whole cache has {bm.num_blocks}"
            )

    def add(self, seq: Sequence) -> None:
        """Queue `seq`, which `check_fits` (called by the engine when it validates the request) accepted."""
        if not seq.params.ignore_eos:
            seq.stop_ids |= self.eos_token_ids
        seq.max_num_tokens = min(seq.max_num_tokens, self.max_model_len)
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        if not self.observers:
            return self._schedule()
        waiting = list(self.waiting)
        out = self._schedule()
        decision = schedule_decision((self.max_num_batched_tokens, self.max_num_seqs), self.block_manager, out,
                                     self.running, waiting)
        for observer in self.observers:
            observer.on_schedule(decision)
        return out

    def _schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            first = seq.prefill_after  # a sample of n: its prompt blocks come from the first's prefill
            if first is not None and not first.is_finished and first.num_computed_tokens < first.num_prompt_tokens:
                break
            seq.prefill_after = None
            cached = self.block_manager.find_cached_prefix(seq)
            num_new = min(seq.num_tokens - len(cached) * self.block_manager.block_size, budget)
            if not self.block_manager.allocate(seq, num_new, cached):
                break
            self.waiting.popleft()
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, num_new))
            budget -= num_new
        return out

    def schedule_ahead(self, in_flight: SchedulerOutput) -> SchedulerOutput | None:
        """Async scheduling: the step after `in_flight`, scheduled before its tokens are known. `in_flight` is taken
        as done (`update` without its tokens: they stay on the device as the next step's input ids) and the step is
        scheduled as any other. None when nothing can run: the engine then waits for `in_flight`."""
        self.update(in_flight, None)
        out = self.schedule()
        return out if out.scheduled else None

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Grant running sequences their next tokens, oldest first; returns the budget left."""
        for seq in self.running:  # (_make_room pops preempted ones off the end: the loop stops before them)
            if budget <= 0:
                break
            if seq.num_pending and seq.num_tokens >= seq.max_num_tokens:
                continue  # its token in flight ends it (length): nothing to compute, no block to take (as vLLM)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._make_room(seq, num_new, out):
                break  # seq was the newest and is preempted itself: nothing after it runs
            out.scheduled.append((seq, num_new))
            budget -= num_new
        return budget

    def _make_room(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        """Allocate for `seq`, preempting the newest running sequences until it fits; False if `seq` went."""
        while not self.block_manager.allocate(seq, num_new):
            victim = self.running.pop()  # the newest; never one already scheduled (those come before seq)
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, out: SchedulerOutput, sampled: dict[int, int] | None) -> list[Sequence]:
        """The one place sequences advance: the scheduled ones count their new tokens as computed, those that sampled
        take their token, and a stop token or the length limit finishes them (returned). `sampled` maps seq_id ->
        token. `sampled` None (async scheduling: `out` is in flight) does the first half only: the tokens are pending
        (Sequence.num_pending) until a second call brings them (a sequence preempted meanwhile keeps its token too:
        its recompute then starts from it)."""
        live = [(s, n) for s, n in out.scheduled if s.status is not SequenceStatus.FINISHED]  # not aborted meanwhile
        if not out.advanced:
            for seq, num_new in live:
                seq.num_pending += sampled is None and out.samples(seq, num_new)
                seq.num_computed_tokens += num_new
            self.block_manager.cache_full_blocks(*(seq for seq, _ in live))
            out.advanced = sampled is None
        finished = []
        for seq, _ in live if sampled is not None else ():
            token = sampled.get(seq.seq_id)
            if token is None:
                continue
            seq.token_ids.append(token)
            seq.num_pending -= out.advanced
            reason = "stop" if token in seq.stop_ids else "length" if len(seq.token_ids) >= seq.max_num_tokens else None
            if reason is not None:
                self.finish(seq, reason)
                finished.append(seq)
        return finished

    def finish(self, seq: Sequence, reason: str) -> None:
        """End `seq` wherever it is (running or waiting) and free its blocks; a no-op if it already ended."""
        if seq.status is SequenceStatus.FINISHED:
            return
        (self.running if seq.status is SequenceStatus.RUNNING else self.waiting).remove(seq)
        self.block_manager.free(seq)
        seq.num_pending = 0  # its step in flight failed or was aborted: that token never comes
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
