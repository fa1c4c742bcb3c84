"""The steady decode step, vectorized: every running sequence computes exactly its last known token.

Most steps of a generation are this case, and the general path (scheduler.py, inputs.py) spends about 1 us per
sequence per step on a slow host in Python bookkeeping. Here the per-step state of the running sequences lives
in numpy arrays updated in place (positions, the block each one writes into, lengths), the Sequence objects are
updated through C-level `map`s, and only the few rows that cross a block boundary or finish go through Python.
The arrays are a cache of the Sequence objects, which stay the truth: the scheduler drops the batch whenever the
running set changes in a way it does not track (admission, preemption, abort, an error, any general-path step)
and builds it again from the objects when every running sequence is decoding. The same idea as vLLM v1's
persistent InputBatch (numpy columns updated in place instead of rebuilt per step). Pure Python + numpy.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, itemgetter

import numpy as np

from .sequence import Sequence

_computed, _token_ids = attrgetter("num_computed_tokens"), attrgetter("token_ids")
_block_table = attrgetter("block_table")


class DecodeBatch:
    def __init__(self, seqs: list[Sequence], block_size: int) -> None:
        """Build from `seqs` (the scheduler's running list, in order); check `all_decoding` before use."""
        self.seqs, self.block_size = list(seqs), block_size
        n = len(seqs)
        self.positions = np.fromiter(map(_computed, seqs), np.int64, n)  # (n,) num_computed_tokens
        lengths = np.fromiter(map(len, map(_token_ids, seqs)), np.int64, n)
        self.all_decoding = bool(n) and bool((lengths == self.positions + 1).all())
        if not self.all_decoding:
            return
        # the lists themselves (a running sequence's token and block lists are only ever appended to)
        self.token_lists, self.tables = list(map(_token_ids, seqs)), list(map(_block_table, seqs))
        self.capacity = np.fromiter(map(len, self.tables), np.int64, n) * block_size
        self.max_num_tokens = np.fromiter(map(attrgetter("max_num_tokens"), seqs), np.int64, n)
        # the next step's input ids, kept (deriving them from token_lists costs ~10 us a step on this path)
        self.last_token = list(map(itemgetter(-1), self.token_lists))
        self.cur_block = np.full(n, -1, np.int64)  # the block each row's next token goes to (-1: not yet known)
        self.stop_rows = [r for r, seq in enumerate(seqs) if seq.stop_ids]
        # (seq_id, temperature, top_k, top_p, seed, num_logprobs) columns, as StepInput wants them
        self.sampling = list(map(list, zip(*map(attrgetter("sampling_row"), seqs))))

    def rows_needing_a_block(self) -> list[int]:
        return np.flatnonzero(self.positions + 1 > self.capacity).tolist()

    def blocks_granted(self, rows: list[int]) -> None:
        self.capacity[rows] += self.block_size

    def refresh_current_blocks(self) -> None:
        """Look up the block of rows that start a new block (or were never looked up), after allocation."""
        bs, tables = self.block_size, self.tables
        rows = np.flatnonzero((self.positions % bs == 0) | (self.cur_block < 0))
        if len(rows):
            index = (self.positions[rows] // bs).tolist()
            self.cur_block[rows] = [tables[r][i] for r, i in zip(rows.tolist(), index)]

    def step_columns(self) -> dict[str, list]:
        """StepInput fields of this decode step (row i = self.seqs[i], its last token, one logits row each)."""
        n, bs = len(self.seqs), self.block_size
        seq_lens = (self.positions + 1).tolist()
        seq_ids, temperature, top_k, top_p, seeds, num_logprobs = (list(c) for c in self.sampling)
        return dict(
            input_ids=list(self.last_token), positions=self.positions.tolist(),
            slot_mapping=(self.cur_block * bs + self.positions % bs).tolist(), query_start_loc=list(range(n + 1)),
            seq_lens=seq_lens, block_tables=list(self.tables), logits_indices=list(range(n)),
            sample_seq_ids=seq_ids, sample_rows=list(range(n)), temperature=temperature, top_k=top_k, top_p=top_p,
            seeds=seeds, counters=list(seq_lens), num_logprobs=num_logprobs,
        )

    def advance(self, tokens: list[int]) -> tuple[list[int], list[tuple[int, str]]]:
        """Append each row's sampled token; returns (rows whose last block became full, [(row, finish reason)])."""
        seqs = self.seqs
        # any(map(...)) runs each call in a C loop (they all return None): the per-sequence writes, ~50 ns each
        any(map(list.append, self.token_lists, tokens))
        self.positions += 1
        self.last_token = tokens
        any(map(setattr, seqs, repeat("num_computed_tokens"), self.positions.tolist()))
        full_rows = np.flatnonzero(self.positions % self.block_size == 0).tolist()
        # the general path's rule (Scheduler._finish_reason): a stop token first, then the length limit
        stopped = {r for r in self.stop_rows if tokens[r] in seqs[r].stop_ids}
        too_long = np.flatnonzero(self.positions + 1 >= self.max_num_tokens).tolist()
        finished = [(r, "stop") for r in stopped] + [(r, "length") for r in too_long if r not in stopped]
        return full_rows, sorted(finished)

    def remove_rows(self, rows: list[int]) -> None:
        """Drop finished rows, keeping the order of the others (the scheduler's running order)."""
        if not rows:
            return
        keep = np.ones(len(self.seqs), dtype=bool)
        keep[rows] = False
        self.seqs = [s for s, k in zip(self.seqs, keep.tolist()) if k]
        for name in ("positions", "capacity", "max_num_tokens", "cur_block"):
            setattr(self, name, getattr(self, name)[keep])
        kept = keep.tolist()
        self.last_token = [t for t, k in zip(self.last_token, kept) if k]
        self.token_lists = [t for t, k in zip(self.token_lists, kept) if k]
        self.tables = [t for t, k in zip(self.tables, kept) if k]
        self.sampling = [[v for v, k in zip(col, kept) if k] for col in self.sampling]
        new_row = (np.cumsum(keep) - 1).tolist()
        self.stop_rows = [new_row[r] for r in self.stop_rows if keep[r]]
