"""What the engine tells outside code about itself, as plain data: its load (`EngineStats`, `LLMEngine.stats()`)
and, to observers registered with `LLMEngine.add_observer`, every scheduling decision (`ScheduleDecision`), so
that a server or a test checking the scheduler's invariants (nanovllm_ref/oracle/schedule_check.py) reads no
scheduler or block manager. Pure Python; built only while an observer is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .block_manager import BlockManager
    from .scheduler import SchedulerOutput
    from .sequence import Sequence


@dataclass(frozen=True)
class EngineStats:
    num_running: int  # sequences (samples) running
    num_waiting: int  # sequences waiting, preempted ones included
    kv_cache_usage: float  # the fraction of KV blocks in use (not free, not only kept for the prefix cache)
    num_preemptions: int  # since the engine started
    spec_decoding: SpecDecodingStats | None = None  # speculative decoding's counts so far (None: it is off)


@dataclass
class SpecDecodingStats:
    """Speculative decoding's counts since the engine started (vLLM's spec_decode metrics): verifications of one
    sequence's drafts, draft tokens verified, accepted, and accepted per draft position."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def count(self, out: SchedulerOutput, accepted: dict[int, list[int]]) -> None:
        """Count a step's verifications (before `Scheduler.update` takes the drafts)."""
        for seq, _ in out.scheduled:
            if not seq.draft_tokens or seq.seq_id not in accepted:
                continue
            n = len(accepted[seq.seq_id])
            self.num_drafts += 1
            self.num_draft_tokens += len(seq.draft_tokens)
            self.num_accepted_tokens += n
            seq.num_draft_tokens += len(seq.draft_tokens)
            seq.num_accepted_tokens += n
            grow = len(seq.draft_tokens) - len(self.accepted_per_position)
            self.accepted_per_position += [0] * max(0, grow)
            for i in range(n):
                self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification: 1 + accepted drafts (vLLM's mean acceptance length)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass(frozen=True)
class SequenceView:
    request_id: str
    arrival: int  # the sequence's arrival order (samples of one request: consecutive)
    num_new_tokens: int  # granted by this decision (0: running but not scheduled)
    num_computed_tokens: int  # before this step (prefix-cache hits of this step included)
    token_ids: tuple[int, ...]  # prompt + generated so far; -1 for a token sampled by a step still in flight
    block_table: tuple[int, ...]


@dataclass(frozen=True)
class ScheduleDecision:
    """One `Scheduler.schedule()`: what it granted, and the state around it."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    scheduled: tuple[SequenceView, ...]
    waiting_before: tuple[SequenceView, ...]  # the waiting queue before the step, head first
    running: tuple[SequenceView, ...]  # every running sequence after the step
    preempted: tuple[SequenceView, ...] = ()
    block_contents: dict[int, tuple[int, ...]] = field(default_factory=dict)  # held block id -> its hashed tokens
    ref_counts: dict[int, int] = field(default_factory=dict)  # held block id -> its reference count


class ScheduleObserver(Protocol):
    def on_schedule(self, decision: ScheduleDecision) -> None: ...


def schedule_decision(limits: tuple[int, int], bm: BlockManager, out: SchedulerOutput, running: list[Sequence],
                      waiting_before: list[Sequence], num_tokens: Callable[[Sequence], int]) -> ScheduleDecision:
    """The decision `out` as plain data; `limits`: (max_num_batched_tokens, max_num_seqs); `num_tokens`: the
    scheduler's count of a sequence's tokens, one in flight included (async scheduling), shown as -1."""
    new = {seq.seq_id: n for seq, n in out.scheduled}

    def view(seq: Sequence) -> SequenceView:
        return SequenceView(seq.request_id, seq.seq_id, new.get(seq.seq_id, 0), seq.num_computed_tokens,
                            tuple(seq.token_ids) + (-1,) * (num_tokens(seq) - seq.num_tokens), tuple(seq.block_table))

    return ScheduleDecision(
        limits[0], limits[1], bm.block_size, tuple(view(seq) for seq, _ in out.scheduled),
        tuple(map(view, waiting_before)), tuple(map(view, running)), tuple(map(view, out.preempted)),
        {b.block_id: b.token_ids for b in bm.blocks if b.hash is not None and b.ref_count > 0},
        {b.block_id: b.ref_count for b in bm.blocks if b.ref_count > 0})
