"""Example-based regression tests for bugs known from nano-vllm's block manager and scheduler."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nanovllm_ref.engine.block_manager import BlockManager, hash_block
from nanovllm_ref.engine.inputs import prepare_step
from nanovllm_ref.engine.scheduler import Scheduler, SchedulerOutput
from nanovllm_ref.engine.sequence import Sequence
from nanovllm_ref.sampling_params import SamplingParams

from .prop_common import fake_next_token, reference_output


def make_seq(tokens: list[int], max_tokens: int = 16, name: str = "r") -> Sequence:
    return Sequence(name, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), seed=0)


def compute(bm: BlockManager, seq: Sequence, num_tokens: int) -> None:
    """Pretend a model step wrote the KV of `num_tokens` more tokens of `seq`."""
    seq.num_computed_tokens += num_tokens
    bm.cache_full_blocks(seq)


def drive(sched: Scheduler, on_step: Callable[[SchedulerOutput], None] = lambda out: None,
          max_steps: int = 500) -> int:
    """Run the engine loop with the fake model until every request ended; returns the number of steps."""
    steps = 0
    while sched.has_unfinished():
        assert steps < max_steps, "the scheduler did not finish"
        out = sched.schedule()
        assert out.scheduled, "requests pending but nothing scheduled"
        on_step(out)
        sampled = {seq.seq_id: fake_next_token(seq.seed, seq.token_ids)
                   for seq, n in out.scheduled if out.samples(seq, n)}
        sched.update(out, sampled)
        steps += 1
    return steps


def assert_all_free(bm: BlockManager) -> None:
    assert bm.num_free_blocks == bm.num_blocks
    assert all(block.ref_count == 0 for block in bm.blocks)


def test_stale_hash_dropped_when_a_freed_block_is_reused() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    a = make_seq([1, 2, 3])
    assert bm.allocate(a, 3)
    compute(bm, a, 3)
    old_block, old_hash = a.block_table[0], a.block_hashes[0]
    assert bm.cached == {old_hash: old_block}
    bm.free(a)
    b = make_seq([9, 9, 9, 9])
    assert bm.find_cached_prefix(b) == []
    assert bm.allocate(b, 4)  # takes the uncached block first, then evicts [1, 2]
    assert b.block_table[1] == old_block
    assert old_hash not in bm.cached
    compute(bm, b, 4)
    assert bm.find_cached_prefix(make_seq([1, 2, 5])) == []  # no stale hit on a block now holding [9, 9]
    for h, block_id in bm.cached.items():
        block = bm.blocks[block_id]
        assert block.hash == h == hash_block(block.parent_hash, list(block.token_ids))


def test_request_that_can_never_fit_is_refused_without_changing_state() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    with pytest.raises(ValueError, match="KV blocks"):
        sched.check_fits(5, 4)  # 9 tokens need 3 blocks of 4
    with pytest.raises(ValueError, match="max_model_len"):
        sched.check_fits(60, 5)
    assert not sched.has_unfinished() and bm.num_free_blocks == 2


def test_lone_sequence_filling_the_whole_cache_runs_to_completion() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    seq = make_seq([1, 2, 3, 4], max_tokens=4)  # 8 tokens: exactly the whole cache
    sched.add(seq)
    drive(sched)
    assert seq.output_token_ids == reference_output([1, 2, 3, 4], seq.params, seq.seed, frozenset())
    assert seq.finish_reason == "length" and sched.num_preemptions == 0
    assert_all_free(bm)


def test_preemption_keeps_competing_requests_going() -> None:
    bm = BlockManager(num_blocks=2, block_size=4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    seqs = [make_seq([1, 2], max_tokens=6, name="a"), make_seq([3, 4], max_tokens=6, name="b")]
    for seq in seqs:
        sched.add(seq)
    drive(sched)
    assert sched.num_preemptions >= 1
    for seq in seqs:
        prompt = seq.token_ids[: seq.num_prompt_tokens]
        assert seq.output_token_ids == reference_output(prompt, seq.params, seq.seed, frozenset())
    assert_all_free(bm)


def test_preempted_sequence_recomputes_from_the_prefix_cache() -> None:
    bm = BlockManager(num_blocks=6, block_size=2)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    a, b = make_seq([1, 2, 3, 4], max_tokens=5, name="a"), make_seq([5, 6, 7, 8], max_tokens=4, name="b")
    sched.add(a)
    sched.add(b)
    resumed: list[tuple[int, int, int, int]] = []  # (blocks in table, computed, new, tokens) at re-admission
    was_waiting = [True]

    def on_step(out: SchedulerOutput) -> None:
        for seq, n in out.scheduled:
            if seq is b and b.num_preemptions and was_waiting[0]:
                resumed.append((len(seq.block_table), seq.num_computed_tokens, n, seq.num_tokens))
        was_waiting[0] = b in sched.waiting

    drive(sched, on_step)
    assert b.num_preemptions == 1 and len(resumed) == 1
    num_blocks, computed, num_new, num_tokens = resumed[0]
    assert computed > 0 and computed % bm.block_size == 0  # the recompute started from cached blocks
    assert computed + num_new == num_tokens and num_blocks == bm.blocks_needed(num_tokens)
    for seq in (a, b):
        prompt = seq.token_ids[: seq.num_prompt_tokens]
        assert seq.output_token_ids == reference_output(prompt, seq.params, seq.seed, frozenset())
    assert_all_free(bm)


def test_fully_cached_prompt_leaves_a_token_to_compute() -> None:
    bm = BlockManager(num_blocks=8, block_size=2)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    sched.add(make_seq([1, 2, 3, 4], max_tokens=1))
    drive(sched)
    assert len(bm.cached) == 2  # both prompt blocks are cached
    again = make_seq([1, 2, 3, 4], max_tokens=1)
    sched.add(again)
    out = sched.schedule()
    assert out.scheduled == [(again, 2)]  # one block from the cache; the last block is recomputed
    assert again.num_computed_tokens == again.num_cached_tokens == 2
    assert out.samples(again, 2)
    assert bm.find_cached_prefix(make_seq([1, 2])) == []  # a one-block prompt cannot be served entirely


def test_chunked_prefill_positions_and_slot_mapping() -> None:
    bs = 2
    bm = BlockManager(num_blocks=8, block_size=bs)
    sched = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=3, max_model_len=64)
    a, b = make_seq(list(range(10, 17)), max_tokens=2, name="a"), make_seq([20, 21, 22], max_tokens=2, name="b")
    sched.add(a)
    sched.add(b)
    chunks: list[list[tuple[str, int, int]]] = []  # per step: (request, first position, num tokens)

    def on_step(out: SchedulerOutput) -> None:
        step = prepare_step(out, bs)
        chunks.append([(seq.request_id, seq.num_computed_tokens, n) for seq, n in out.scheduled])
        assert step.query_start_loc == [0] + [sum(n for _, n in out.scheduled[: i + 1])
                                             for i in range(len(out.scheduled))]
        for i, (seq, n) in enumerate(out.scheduled):
            lo, start = step.query_start_loc[i], seq.num_computed_tokens
            positions = list(range(start, start + n))
            assert list(step.positions[lo : lo + n]) == positions
            assert list(step.input_ids[lo : lo + n]) == seq.token_ids[start : start + n]
            table = seq.block_table
            assert list(step.slot_mapping[lo : lo + n]) == [table[p // bs] * bs + p % bs for p in positions]
            assert step.seq_lens[i] == start + n
        samplers = [seq.seq_id for seq, n in out.scheduled if seq.num_computed_tokens + n == seq.num_tokens]
        assert step.sample_seq_ids == samplers  # only a chunk that ends at the last known token samples

    drive(sched, on_step)
    assert chunks[:4] == [
        [("a", 0, 3)],  # the budget of 3 splits a's 7-token prompt
        [("a", 3, 3)],
        [("a", 6, 1), ("b", 0, 2)],  # a's last prompt token samples; b starts with the 2 tokens left
        [("a", 7, 1), ("b", 2, 1)],  # a decodes; b's last prompt token samples
    ]
    assert a.num_output_tokens == b.num_output_tokens == 2
    assert_all_free(bm)
