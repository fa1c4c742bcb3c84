"""engine/overlap.py's pieces on their own: OverlapScheduler's accounting of the tokens in flight, and gather_rows, the
index the device gathers the step behind's input ids with (the host's ids, then the step in flight's tokens)."""

from __future__ import annotations

from array import array

import torch

from nanovllm_ref import SamplingParams
from nanovllm_ref.engine.block_manager import BlockManager
from nanovllm_ref.engine.inputs import prepare_step
from nanovllm_ref.engine.overlap import OverlapScheduler, gather_rows
from nanovllm_ref.engine.scheduler import SchedulerOutput
from nanovllm_ref.engine.sequence import Sequence
from nanovllm_ref.engine.staging import stage_step


def _seq(tokens: list[int], computed: int, block: int) -> Sequence:
    seq = Sequence("r", tokens, SamplingParams(max_tokens=8, ignore_eos=True), seed=0)
    seq.block_table, seq.num_computed_tokens = array("i", [block]), computed
    return seq


def test_gather_rows_feeds_each_row_its_own_sequences_token_whatever_the_order():
    """The step in flight samples a, b and c (and runs d's prefill chunk, which samples nothing); behind it, a has
    finished (gone), c and b come in another order with a prefill of a new request and the recompute of a preempted one
    between them: each continuing row gets its own sequence's token, every other row the host's id."""
    a, b, c = _seq([1, 2], 1, 0), _seq([3, 4, 5], 2, 1), _seq([6], 0, 2)
    d = _seq([7, 8, 9, 10], 0, 3)
    in_flight = prepare_step(SchedulerOutput(scheduled=[(a, 1), (b, 1), (d, 2), (c, 1)]), 16)
    assert in_flight.sample_seq_ids == [a.seq_id, b.seq_id, c.seq_id]
    sampled = {a.seq_id: 101, b.seq_id: 102, c.seq_id: 103}  # the device's tokens, in its sampling rows' order
    for seq, n in [(b, 1), (c, 1), (d, 2)]:
        seq.num_computed_tokens += n  # counted as computed (OverlapScheduler.take_in_flight)
    new, recomputed = _seq([20, 21, 22], 0, 4), _seq([30, 31, 32, 33], 0, 5)
    behind = SchedulerOutput(scheduled=[(c, 1), (new, 3), (d, 2), (recomputed, 4), (b, 1)])
    step = prepare_step(behind, 16)
    assert step.input_ids.tolist() == [20, 21, 22, 9, 10, 30, 31, 32, 33]  # only the tokens the host knows
    rows = gather_rows(behind, step, in_flight)
    source = step.input_ids.tolist() + [sampled[s] for s in in_flight.sample_seq_ids]
    assert [source[r] for r in rows] == [103, 20, 21, 22, 9, 10, 30, 31, 32, 33, 102]
    assert step.sample_seq_ids == [c.seq_id, new.seq_id, d.seq_id, recomputed.seq_id, b.seq_id]
    assert step.counters == [2, 3, 4, 4, 4]  # the positions they sample: c's and b's one past their known tokens
    ids, *_, device_rows = stage_step(step, torch.device("cpu"), 64, rows)  # what ModelRunner.compute_hidden gathers
    tokens = torch.tensor([sampled[s] for s in in_flight.sample_seq_ids])
    assert torch.cat([ids, tokens])[device_rows].tolist() == [source[r] for r in rows]


def test_gather_rows_is_none_when_the_host_knows_every_token():
    a = _seq([1, 2, 3], 1, 0)
    in_flight = prepare_step(SchedulerOutput(scheduled=[(a, 1)]), 16)
    out = SchedulerOutput(scheduled=[(a, 2)])
    assert gather_rows(out, prepare_step(out, 16), in_flight) is None


def test_overlap_scheduler_counts_the_token_in_flight_until_it_comes():
    """A decode in flight is counted as computed and its sequence one token longer, so the step behind decodes that
    token; a row whose token in flight reaches its length limit gets nothing more; `update` of the step in flight
    takes the tokens through the scheduler's own rules (finish by length), and a step nothing was scheduled behind
    takes the plain update."""
    s = OverlapScheduler(BlockManager(8, 4), 4, 64, 64)
    long, short = (Sequence(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=n, ignore_eos=True), seed=i)
                   for i, n in enumerate((5, 2)))
    s.add(long)
    s.add(short)
    first = s.schedule()
    assert [(q, n) for q, n in first.scheduled] == [(long, 3), (short, 3)]
    assert s.update(first, {long.seq_id: 1, short.seq_id: 2}) == []  # (nothing in flight: the plain update)
    second = s.schedule()
    s.take_in_flight(second)
    assert s.in_flight == {long, short} and s.num_tokens(long) == 5 and long.num_computed_tokens == 4
    behind = s.schedule()
    assert [(q, n) for q, n in behind.scheduled] == [(long, 1)]  # short's token in flight is its last (length)
    assert s.update(second, {long.seq_id: 3, short.seq_id: 4}) == [short]
    assert short.finish_reason == "length" and short.output_token_ids == [2, 4] and not s.in_flight
    assert long.token_ids == [5, 6, 7, 1, 3] and s.counted is None
    s.finish(long, "abort")
    assert not s.has_unfinished()


def test_gather_rows_of_a_step_of_decodes_only_is_the_in_flight_rows_by_sequence():
    """Every row continues from the step in flight (the steady decode): the index is the sampled tokens' rows, in the
    step behind's order, which lost a finished row."""
    seqs = [_seq([1, 2, 3], 2, i) for i in range(4)]
    in_flight = prepare_step(SchedulerOutput(scheduled=[(q, 1) for q in seqs]), 16)
    for q in seqs:
        q.num_computed_tokens += 1
    behind = SchedulerOutput(scheduled=[(seqs[3], 1), (seqs[0], 1), (seqs[2], 1)])  # seqs[1] finished in flight
    step = prepare_step(behind, 16)
    assert len(step.input_ids) == 0 and gather_rows(behind, step, in_flight).tolist() == [3, 0, 2]
