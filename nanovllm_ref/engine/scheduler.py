"""Token-budget continuous batching (vLLM v1 style), pure Python.

Each step grants every scheduled sequence a number of new tokens within `max_num_batched_tokens`: running
sequences first (a decode is 1 token, an unfinished prefill chunk more), then waiting ones in arrival order
(FCFS: the oldest waiting request is never skipped for a younger one). When blocks run out, the newest
running sequence is preempted: its blocks are freed and it is recomputed later from its tokens, so its
output is unaffected. Nothing here asserts: a request that could never fit is refused before it is added
(`check_fits`).
Every step, decodes included, takes this one path: a step's inputs are derived from the sequences (inputs.py).
Speculative decoding (`num_lookahead_tokens` > 0, vLLM's name) grants a decoding sequence room for that many draft
tokens after its last one; the proposer (proposers.py) fills `seq.draft_tokens` and trims the grant to what it
proposed, and `update` counts as computed only the drafts the verification accepted (the rejected ones' KV is
overwritten later: that is the rollback).
Async scheduling (overlap.py's OverlapScheduler, vLLM v1's AsyncScheduler) schedules the step behind the one in
flight through this same code: it counts the token in flight of each sequence in `num_tokens` and splits `update`
into its two halves, `count_computed` when the step is launched and `take_tokens` when its tokens come.
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

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def samples(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether this step ends at the sequence's last known token, i.e. yields a next token (or, a row continuing
        from a token in flight (overlap.py), one past it: that token is its input)."""
        return seq.num_computed_tokens + num_new_tokens >= seq.num_tokens


def lookahead_room(seq: Sequence, num_new: int) -> int:
    """How many draft tokens a grant of `num_new` leaves room for after the sequence's known tokens."""
    return num_new - (seq.num_tokens - seq.num_computed_tokens)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, eos_token_ids: frozenset[int] = frozenset(), num_lookahead_tokens: int = 0,
                 ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.num_lookahead_tokens = num_lookahead_tokens
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
                                     self.running, waiting, self.num_tokens)
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

    def num_tokens(self, seq: Sequence) -> int:
        """The tokens of `seq` a step may compute up to: its known ones (OverlapScheduler adds one in flight)."""
        return seq.num_tokens

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Grant running sequences their next tokens, oldest first; returns the budget left."""
        for seq in self.running:  # (_make_room pops preempted ones off the end: the loop stops before them)
            if budget <= 0:
                break
            num_tokens = self.num_tokens(seq)
            if num_tokens >= seq.max_num_tokens:
                continue  # its token in flight ends it (length): nothing to compute, no block to take (as vLLM)
            num_new = min(num_tokens - seq.num_computed_tokens + self._lookahead(seq, num_tokens), budget)
            if not self._make_room(seq, num_new, out):
                break  # seq was the newest and is preempted itself: nothing after it runs
            out.scheduled.append((seq, num_new))
            budget -= num_new
        return budget

    def _lookahead(self, seq: Sequence, num_tokens: int) -> int:
        """Room for draft tokens: a decoding sequence's (prefill done), as many as it may still emit after the next."""
        if not self.num_lookahead_tokens or seq.num_computed_tokens != num_tokens - 1:
            return 0
        return max(0, min(self.num_lookahead_tokens, seq.max_num_tokens - num_tokens - 1))

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

    def update(self, out: SchedulerOutput, sampled: dict[int, int],
               accepted: dict[int, list[int]] | None = None) -> list[Sequence]:
        """The one place sequences advance: the scheduled ones count their new tokens as computed, those that sampled
        take their token (`sampled` maps seq_id -> token), and a stop token or the length limit finishes them
        (returned). `accepted` (speculative steps): seq_id -> the draft tokens the verification accepted, which come
        before its sampled token. Async scheduling calls the two halves apart (overlap.py), the first while the step
        is in flight."""
        self.count_computed(out, sampled, accepted or {})
        return self.take_tokens(out, sampled)

    def count_computed(self, out: SchedulerOutput, sampled: dict[int, int] | None = None,
                       accepted: dict[int, list[int]] | None = None) -> None:
        """The first half of `update`: the step's tokens are computed (their KV written), its full blocks cached. A
        sequence that verified drafts takes the accepted ones as tokens here (so that its blocks hash them) and
        counts only those as computed: the rejected drafts' KV is stale, overwritten by the next step."""
        live = [(s, n) for s, n in out.scheduled if s.status is not SequenceStatus.FINISHED]  # not aborted meanwhile
        for seq, num_new in live:
            if seq.draft_tokens:
                num_new -= len(seq.draft_tokens) - self._take_accepted(seq, sampled, accepted.get(seq.seq_id, []))
                seq.draft_tokens = []
            seq.num_computed_tokens += num_new
        self.block_manager.cache_full_blocks(*(seq for seq, _ in live))

    def _take_accepted(self, seq: Sequence, sampled: dict[int, int], drafts: list[int]) -> int:
        """Append the accepted drafts up to the first that ends the sequence, which becomes its sampled token (the
        ones after it are dropped: the request would have ended there); returns how many were appended."""
        for i, token in enumerate(drafts):
            if token in seq.stop_ids or len(seq.token_ids) + 1 >= seq.max_num_tokens:
                sampled[seq.seq_id] = token
                drafts = drafts[:i]
                break
            seq.token_ids.append(token)
        return len(drafts)

    def take_tokens(self, out: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        """The second half of `update`: the sampled tokens are appended, and the sequences they end finish (returned).
        A sequence preempted since the step was scheduled takes its token too: its recompute then starts from it."""
        finished = []
        for seq, _ in out.scheduled:
            token = sampled.get(seq.seq_id)
            if token is None or seq.status is SequenceStatus.FINISHED:
                continue
            seq.token_ids.append(token)
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
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
