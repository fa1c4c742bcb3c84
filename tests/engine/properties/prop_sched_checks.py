"""Per-step checks of a scheduler decision and of the model inputs `prepare_step` builds from it."""

from __future__ import annotations

from nanovllm_ref.engine.inputs import StepInput
from nanovllm_ref.engine.scheduler import Scheduler, SchedulerOutput
from nanovllm_ref.engine.sequence import Sequence, SequenceStatus

from .prop_common import check, name


def check_schedule(s: Scheduler, out: SchedulerOutput, waiting_before: list[Sequence]) -> None:
    """Budget, batch size, per-sequence token counts, preemption bookkeeping and FCFS admission."""
    bs = s.block_manager.block_size
    check(out.num_batched_tokens <= s.max_num_batched_tokens, "token-budget",
          f"{out.num_batched_tokens} tokens scheduled, budget {s.max_num_batched_tokens}")
    check(len(out.scheduled) <= s.max_num_seqs, "max-num-seqs",
          f"{len(out.scheduled)} sequences scheduled, max_num_seqs {s.max_num_seqs}")
    seqs = [seq for seq, _ in out.scheduled]
    check(len({q.seq_id for q in seqs}) == len(seqs), "scheduled", "a sequence is scheduled twice")
    for seq, n in out.scheduled:
        check(n >= 1 and seq.num_computed_tokens + n <= s.num_tokens(seq), "num-new-tokens",
              f"{name(seq)}: {n} new tokens after {seq.num_computed_tokens} computed of {s.num_tokens(seq)}")
        check(seq.status is SequenceStatus.RUNNING and seq in s.running, "scheduled",
              f"scheduled {name(seq)} is {seq.status.value}, not running")
        check(len(seq.block_table) * bs >= seq.num_computed_tokens + n, "capacity",
              f"{name(seq)}: {len(seq.block_table)} blocks of {bs} for {seq.num_computed_tokens + n} tokens")
    for seq in out.preempted:
        check(seq not in seqs and seq.status is SequenceStatus.WAITING and seq in s.waiting, "preemption",
              f"preempted {name(seq)} is {seq.status.value} / scheduled={seq in seqs}")
        check(not seq.block_table and seq.num_computed_tokens == 0, "preemption",
              f"preempted {name(seq)} keeps blocks {seq.block_table} / {seq.num_computed_tokens} computed")
    admitted = [q for q in seqs if any(q is w for w in waiting_before)]
    for seq in admitted:
        skipped = [name(w) for w in waiting_before if w.seq_id < seq.seq_id and all(w is not a for a in admitted)]
        check(not skipped, "fcfs", f"{name(seq)} admitted while older waiting requests {skipped} were not")


def check_step_input(s: Scheduler, out: SchedulerOutput, step: StepInput, bs: int) -> None:
    """Positions, input ids, slot mapping and sequence lengths of every scheduled chunk. The input ids are those the
    host knows (a token the step in flight samples is gathered on the device: the fake model checks that)."""
    check(step.query_start_loc[0] == 0 and len(step.seq_lens) == len(out.scheduled), "slot-mapping",
          "query_start_loc / seq_lens do not match the schedule")
    known = []
    for i, (seq, n) in enumerate(out.scheduled):
        lo, hi = step.query_start_loc[i], step.query_start_loc[i + 1]
        start = seq.num_computed_tokens
        positions = list(range(start, start + n))
        slots = [seq.block_table[p // bs] * bs + p % bs for p in positions]
        check(hi - lo == n and list(step.positions[lo:hi]) == positions, "slot-mapping",
              f"{name(seq)}: positions {step.positions[lo:hi]}, want {positions}")
        known += seq.token_ids[start : start + n]
        check(list(step.slot_mapping[lo:hi]) == slots, "slot-mapping",
              f"{name(seq)}: slots {step.slot_mapping[lo:hi]}, want {slots}")
        table = seq.block_table.tolist()
        check(step.seq_lens[i] == start + n and step.block_tables[i, : len(table)].tolist() == table, "slot-mapping",
              f"{name(seq)}: seq_len {step.seq_lens[i]}, want {start + n}")
    check(list(step.input_ids) == known, "slot-mapping", f"input ids {step.input_ids}, want {known}")
    samplers = [seq for seq, n in out.scheduled if out.samples(seq, n)]
    check(step.sample_seq_ids == [q.seq_id for q in samplers], "slot-mapping",
          f"sampling seq_ids {step.sample_seq_ids}, want those of {[name(q) for q in samplers]}")
    for seq, counter in zip(samplers, step.counters):
        check(counter == s.num_tokens(seq), "slot-mapping", f"{name(seq)} samples position {counter}")
