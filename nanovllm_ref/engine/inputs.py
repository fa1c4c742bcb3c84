"""Turn a scheduler decision into the flat, picklable inputs of one model step (pure Python).

Built once on rank 0 and, under tensor parallelism, broadcast as is: workers keep no sequence state, so
they can never disagree with the scheduler about prefill, decode or preemption. The per-token columns of a
step (input ids, positions, slots: 16,384 of each in a headline prefill step) are numpy arrays, computed from the
per-sequence ones with a few vector operations; the runner stages them for the device with one copy.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from ..sampling_params import ProcessedRow
from .scheduler import SchedulerOutput
from .sequence import Sequence


@dataclass
class StepInput:
    # per token (int64 arrays from prepare_step)
    # the ids of the tokens the host knows, in row order: every row's, but those whose token is still sampled on the
    # device (async scheduling: overlap.py gathers them there); the rows are query_start_loc's
    input_ids: list[int] | np.ndarray = field(default_factory=list)
    positions: list[int] | np.ndarray = field(default_factory=list)
    slot_mapping: list[int] | np.ndarray = field(default_factory=list)
    query_start_loc: list[int] = field(default_factory=lambda: [0])
    seq_lens: list[int] = field(default_factory=list)
    # (num_seqs, widest table) int32, zero-padded: one copy to the device, and one raw buffer in the tensor-parallel
    # wire format (workers.py pickles one StepInput per step for every rank; a list per table took ~5x longer)
    block_tables: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int32))
    logits_indices: list[int] = field(default_factory=list)  # token rows whose logits are needed
    # one entry per sampling sequence; *_rows index into logits_indices
    sample_seq_ids: list[int] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)
    temperature: list[float] = field(default_factory=list)
    top_k: list[int] = field(default_factory=list)
    top_p: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    counters: list[int] = field(default_factory=list)  # position of the token being sampled
    num_logprobs: list[int] = field(default_factory=list)  # -1: none
    # rows with penalties, logit bias, min_tokens, min-p or processed logprobs (empty for plain batches)
    processed: list[ProcessedRow] = field(default_factory=list)
    # prompt logprobs: (seq_id, rows, target token ids, k)
    prompt_logprobs: list[tuple[int, list[int], list[int], int]] = field(default_factory=list)
    # speculative decoding: (seq_id, its first sampling row, its draft tokens); row i verifies draft i, the row after
    # the last draft samples the bonus token (engine/verify.py)
    drafts: list[tuple[int, int, list[int]]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]

    def logits_rows_are_all_rows(self) -> bool:
        """True in pure decode steps: every token row is a logits row, in order (no gather needed)."""
        n = len(self.logits_indices)
        return n == self.num_tokens and (n == 0 or self.logits_indices[-1] == n - 1)

    def sample_rows_are_all_rows(self) -> bool:
        n = len(self.sample_rows)
        return n == len(self.logits_indices) and (n == 0 or self.sample_rows[-1] == n - 1)

    @property
    def max_query_len(self) -> int:
        return int(np.diff(self.query_start_loc).max(initial=0))


def prepare_step(out: SchedulerOutput, block_size: int) -> StepInput:
    """The step's inputs, derived from its sequences (decode steps, prefill chunks and mixed steps alike)."""
    step = StepInput()
    input_ids, sampling_rows, tables = [], [], []
    for seq, num_new in out.scheduled:
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + num_new
        input_ids += seq.token_ids[start:end] if not seq.draft_tokens else (seq.token_ids + seq.draft_tokens)[start:end]
        step.query_start_loc.append(step.query_start_loc[-1] + num_new)
        step.seq_lens.append(end)
        tables.append(seq.block_table)
        if seq.params.prompt_logprobs is not None:
            _add_prompt_logprobs(step, seq, start, end, step.query_start_loc[-2])
        if seq.draft_tokens:
            _add_verify_rows(step, seq, sampling_rows)
        elif out.samples(seq, num_new):
            if seq.needs_processing:
                step.processed.append(ProcessedRow(len(sampling_rows), seq.params, seq.token_ids, seq.num_prompt_tokens,
                                                   seq.stop_ids, seq.seq_id))
            sampling_rows.append(seq.sampling_row + (len(step.logits_indices), end))
            step.logits_indices.append(step.query_start_loc[-1] - 1)
    if sampling_rows:  # one transpose instead of eight appends per sequence
        (step.sample_seq_ids, step.temperature, step.top_k, step.top_p, step.seeds, step.num_logprobs,
         step.sample_rows, step.counters) = map(list, zip(*sampling_rows))
    _token_columns(step, input_ids, tables, block_size)
    return step


def _add_verify_rows(step: StepInput, seq: Sequence, sampling_rows: list[tuple]) -> None:
    """The sampling rows of a sequence verifying drafts: its last token's and each draft's, in order; row i samples
    the token at position num_tokens + i from the target's distribution given the drafts before it."""
    drafts, n = seq.draft_tokens, seq.num_tokens
    step.drafts.append((seq.seq_id, len(sampling_rows), list(drafts)))
    last_row = step.query_start_loc[-1] - 1 - len(drafts)
    for i in range(len(drafts) + 1):
        if seq.needs_processing:  # (row 0 keeps the penalty counts; the others rebuild theirs: seq_id -1)
            tokens = seq.token_ids + drafts[:i] if i else seq.token_ids
            step.processed.append(ProcessedRow(len(sampling_rows), seq.params, tokens, seq.num_prompt_tokens,
                                               seq.stop_ids, -1 if i else seq.seq_id))
        sampling_rows.append(seq.sampling_row + (len(step.logits_indices), n + i))
        step.logits_indices.append(last_row + i)


def _token_columns(step: StepInput, input_ids: list[int], tables: list[array], block_size: int) -> None:
    """input_ids, positions and slot_mapping as int64 arrays, and the block tables as one zero-padded array."""
    widths = np.fromiter(map(len, tables), np.int64, len(tables))
    table_array = np.zeros((len(tables), int(widths.max(initial=0))), np.int32)
    # one buffer join and one masked store: ~40 us at 256 tables of 44 blocks (a flat copy of their 11k Python ints
    # took ~300-400 us)
    table_array[np.arange(table_array.shape[1]) < widths[:, None]] = np.frombuffer(b"".join(tables), np.intc)
    q = np.array(step.query_start_loc, np.int64)
    lens = np.diff(q)
    seq_of_token = np.repeat(np.arange(len(table_array)), lens)  # (num_tokens,)
    # a sequence's token i is at position seq_len - len + i: its row q[s] + i plus seq_len - q[s + 1]
    positions = np.arange(q[-1]) + np.repeat(np.array(step.seq_lens, np.int64) - q[1:], lens)
    slots = table_array[seq_of_token, positions // block_size].astype(np.int64) * block_size + positions % block_size
    step.input_ids = np.fromiter(input_ids, np.int64, len(input_ids))  # (faster than np.array from a list)
    step.positions, step.slot_mapping, step.block_tables = positions, slots, table_array


def _add_prompt_logprobs(step: StepInput, seq: Sequence, start: int, end: int, first_row: int) -> None:
    # logits at position p give the logprob of prompt token p + 1; a recompute after preemption
    # skips the positions already reported
    first = max(start, len(seq.prompt_logprobs) - 1)
    last = min(end, seq.num_prompt_tokens - 1)
    if first < last:
        rows = list(range(len(step.logits_indices), len(step.logits_indices) + last - first))
        step.logits_indices += range(first_row + first - start, first_row + last - start)
        targets = seq.token_ids[first + 1 : last + 1]
        step.prompt_logprobs.append((seq.seq_id, rows, targets, seq.params.prompt_logprobs))


def chunks_step(chunks: list[tuple[list[int], int, array]], block_size: int) -> StepInput:
    """A forward over chunks of sequences outside the scheduler's accounting (a draft model's, proposers): each
    (token ids, position of the first, block table), its logits row its last token."""
    step = StepInput()
    for tokens, start, _ in chunks:
        step.query_start_loc.append(step.query_start_loc[-1] + len(tokens))
        step.seq_lens.append(start + len(tokens))
        step.logits_indices.append(step.query_start_loc[-1] - 1)
    _token_columns(step, [t for tokens, _, _ in chunks for t in tokens], [table for _, _, table in chunks], block_size)
    return step


def dummy_prefill_step(num_seqs: int, q_len: int, block_size: int) -> StepInput:
    """A prefill of `num_seqs` fresh sequences of `q_len` zero tokens, for warm-ups: every slot is -1 (nothing is
    written) and every block table entry is block 0."""
    tables = [array("i", [0] * -(-q_len // block_size))] * num_seqs
    ends = list(range(q_len, num_seqs * q_len + 1, q_len))
    step = StepInput(query_start_loc=[0, *ends], seq_lens=[q_len] * num_seqs, logits_indices=[end - 1 for end in ends])
    _token_columns(step, [0] * (num_seqs * q_len), tables, block_size)
    step.slot_mapping[:] = -1
    return step
