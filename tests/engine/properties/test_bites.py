"""Each invariant bites: a small deliberate bug is patched in, and Hypothesis must find a counterexample.

Every test monkeypatches one method of the block manager or scheduler with a buggy variant, runs a state
machine with fixed settings (derandomized, so the outcome is reproducible) and asserts that the targeted
invariant's AssertionError (matched by its `[tag]`) is raised.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from nanovllm_ref.engine.block_manager import BlockManager, hash_block
from nanovllm_ref.engine.scheduler import Scheduler
from nanovllm_ref.engine.sequence import Sequence, SequenceStatus

from .prop_block_machine import BlockManagerMachine
from .prop_sched_machine import SchedulerMachine

BITE = settings(max_examples=300, derandomize=True, deadline=None, database=None, report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck), print_blob=False,
                phases=(Phase.explicit, Phase.generate))  # finding is the point; shrinking would cost minutes


def assert_bites(machine: type[RuleBasedStateMachine], tag: str) -> None:
    with pytest.raises(AssertionError, match=rf"\[{tag}\]"):
        run_state_machine_as_test(machine, settings=BITE)


def patch(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> Callable[[Callable], Callable]:
    """Decorator: replace `cls.name` with the decorated (buggy) function for this test only."""
    def apply(fn: Callable) -> Callable:
        monkeypatch.setattr(cls, name, fn)
        return fn
    return apply


# ---- block manager ---------------------------------------------------------------------------------
def test_invariant_bites_refcount(monkeypatch: pytest.MonkeyPatch) -> None:
    """free forgets to decrement the ref count of blocks still shared with another sequence."""
    @patch(monkeypatch, BlockManager, "free")
    def free(self: BlockManager, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            if block.ref_count == 1:
                block.ref_count = 0
                self.free_queue[block_id] = None
                if block.hash is None:
                    self.free_queue.move_to_end(block_id, last=False)
        del seq.block_table[:]
        seq.block_hashes, seq.num_computed_tokens = [], 0

    assert_bites(BlockManagerMachine, "refcount")


def test_invariant_bites_stale_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """Handing out a cached block resets its content but forgets to drop its hash -> block map entry."""
    @patch(monkeypatch, BlockManager, "_take_free_block")
    def take(self: BlockManager) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        block.hash, block.parent_hash, block.token_ids = None, 0, ()
        block.ref_count = 1
        return block_id

    assert_bites(BlockManagerMachine, "hash-map")


def test_invariant_bites_lru(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free blocks are handed out most-recently-freed first (MRU eviction)."""
    original = BlockManager._take_free_block

    @patch(monkeypatch, BlockManager, "_take_free_block")
    def take(self: BlockManager) -> int:
        self.free_queue.move_to_end(next(reversed(self.free_queue)), last=False)
        return original(self)

    assert_bites(BlockManagerMachine, "lru")


def _find_whole_prefix(self: BlockManager, seq: Sequence) -> list[int]:
    """find_cached_prefix that may cover every token (it forgets to leave the last one to compute)."""
    if not self.enable_prefix_caching or not seq.uses_prefix_cache:
        return []
    hits, parent, bs = [], 0, self.block_size
    for i in range(seq.num_tokens // bs):
        tokens = seq.token_ids[i * bs : (i + 1) * bs]
        h = hash_block(parent, tokens)
        block_id = self.cached.get(h)
        if block_id is None or self.blocks[block_id].token_ids != tuple(tokens):
            break
        hits.append(block_id)
        parent = h
    self.num_queries += (seq.num_tokens - 1) // bs
    self.num_hits += len(hits)
    return hits


def test_invariant_bites_prefix_hit_covers_whole_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BlockManager, "find_cached_prefix", _find_whole_prefix)
    assert_bites(BlockManagerMachine, "prefix-hit-leaves-a-token")


def test_invariant_bites_prefix_hit_covers_whole_prompt_in_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BlockManager, "find_cached_prefix", _find_whole_prefix)
    assert_bites(SchedulerMachine, "num-new-tokens")


def test_invariant_bites_output_blocks_not_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    """cache_full_blocks only hashes prompt blocks: full blocks of generated tokens are never cached."""
    original = BlockManager.cache_full_blocks

    @patch(monkeypatch, BlockManager, "cache_full_blocks")
    def cache_full_blocks(self: BlockManager, seq: Sequence) -> None:
        computed = seq.num_computed_tokens
        seq.num_computed_tokens = min(computed, seq.num_prompt_tokens)
        try:
            original(self, seq)
        finally:
            seq.num_computed_tokens = computed

    assert_bites(BlockManagerMachine, "hashed")


# ---- scheduler -------------------------------------------------------------------------------------
def test_invariant_bites_token_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler grants one token more than max_num_batched_tokens."""
    original = Scheduler.schedule

    @patch(monkeypatch, Scheduler, "schedule")
    def schedule(self: Scheduler):
        self.max_num_batched_tokens += 1
        try:
            return original(self)
        finally:
            self.max_num_batched_tokens -= 1

    assert_bites(SchedulerMachine, "token-budget")


def test_invariant_bites_fcfs(monkeypatch: pytest.MonkeyPatch) -> None:
    """New arrivals jump the queue: a younger waiting request is admitted before an older one."""
    @patch(monkeypatch, Scheduler, "add")
    def add(self: Scheduler, seq: Sequence) -> None:
        self.waiting.appendleft(seq)

    assert_bites(SchedulerMachine, "fcfs")


def test_invariant_bites_preemption_loses_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """A preempted request restarts from its prompt: its output tokens so far are lost."""
    original = Scheduler._preempt

    @patch(monkeypatch, Scheduler, "_preempt")
    def preempt(self: Scheduler, seq: Sequence) -> None:
        original(self, seq)
        del seq.token_ids[seq.num_prompt_tokens :]

    assert_bites(SchedulerMachine, "tokens-preserved")


def test_invariant_bites_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """check_fits ignores the KV cache size, so a request that can never fit is accepted."""
    @patch(monkeypatch, Scheduler, "check_fits")
    def check_fits(self: Scheduler, num_prompt_tokens: int, max_tokens: int) -> None:
        if num_prompt_tokens + max_tokens > self.max_model_len:
            raise ValueError("too long")

    assert_bites(SchedulerMachine, "refuse")


def test_invariant_bites_finish_off_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request finishes one token late: it produces max_tokens + 1 tokens."""
    original = Scheduler.add

    @patch(monkeypatch, Scheduler, "add")
    def add(self: Scheduler, seq: Sequence) -> None:
        original(self, seq)
        seq.max_num_tokens += 1

    assert_bites(SchedulerMachine, "finish")


def test_invariant_bites_abort_leaks_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Aborting a request dequeues it but forgets to free its blocks."""
    original = Scheduler.finish

    @patch(monkeypatch, Scheduler, "finish")
    def finish(self: Scheduler, seq: Sequence, reason: str) -> None:
        if reason != "abort":
            return original(self, seq, reason)
        (self.running if seq.status is SequenceStatus.RUNNING else self.waiting).remove(seq)
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason

    assert_bites(SchedulerMachine, "blocks")


def test_invariant_bites_liveness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission stops one short of max_num_seqs: with max_num_seqs=1 no request ever starts."""
    original = Scheduler.schedule

    @patch(monkeypatch, Scheduler, "schedule")
    def schedule(self: Scheduler):
        self.max_num_seqs -= 1
        try:
            return original(self)
        finally:
            self.max_num_seqs += 1

    assert_bites(SchedulerMachine, "progress")
