"""The steady decode step, vectorized: every running sequence computes exactly its last known token.

Most steps of a generation are this case, and the general path (scheduler.py, inputs.py) spends about 1 us per
sequence per step on a slow host in Python bookkeeping. Here the per-step state of the running sequences is
kept as numpy columns relative to a step counter `t`: every row advances by exactly one token per step, so a
row's position is `pos0 + t` and, inside a block, its KV slot is `slot0 + t`. A step is then one vector add, and
only the rows at a block boundary (1 in block_size of them per step, found by their phase `pos0 % block_size`)
or finishing go through Python. The Sequence objects are updated through C-level `map`s and stay the truth: the
scheduler drops the batch whenever the running set changes in a way it does not track (admission, preemption,
abort, an error, any general-path step) and builds it again from the objects when every running sequence is
decoding. The same idea as vLLM v1's persistent InputBatch (columns updated in place instead of rebuilt per
step). Pure Python + numpy.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, itemgetter

import numpy as np

from .block_manager import BlockManager
from .sequence import Sequence

_computed, _token_ids = attrgetter("num_computed_tokens"), attrgetter("token_ids")
_block_table = attrgetter("block_table")


class DecodeBatch:
    def __init__(self, seqs: list[Sequence], block_size: int) -> None:
        """Build from `seqs` (the scheduler's running list, in order); check `all_decoding` before use."""
        # t: steps advanced (their tokens appended); t_claim: steps scheduled. t_claim = t + 2 while a step is
        # scheduled ahead of the one in flight (async scheduling)
        self.seqs, self.block_size, self.t, self.t_claim = list(seqs), block_size, 0, 0
        n = len(seqs)
        pos0 = np.fromiter(map(_computed, seqs), np.int64, n)  # (n,) positions at t = 0
        lengths = np.fromiter(map(len, map(_token_ids, seqs)), np.int64, n)
        self.all_decoding = bool(n) and bool((lengths == pos0 + 1).all())
        if not self.all_decoding:
            return
        # the lists themselves (a running sequence's token and block lists are only ever appended to)
        self.token_lists, self.tables = list(map(_token_ids, seqs)), list(map(_block_table, seqs))
        # rows: position, sequence length (= the sampling counter), KV slot; each is `base + t`. A row whose
        # position starts a block gets its slot when the block is known (`claim_blocks`).
        self.base = np.stack([pos0, pos0 + 1, np.zeros_like(pos0)])  # (3, n)
        bs = block_size
        for r, (table, p) in enumerate(zip(self.tables, pos0.tolist())):
            if p % bs:
                self.base[2, r] = table[p // bs] * bs + p % bs
        self.finish_t = np.fromiter(map(attrgetter("max_num_tokens"), seqs), np.int64, n) - 1 - pos0
        # the block tables as one zero-padded int32 array, grown in place as rows get blocks: the CUDA-graph
        # runner copies it with one numpy assignment instead of one per row
        width = max(map(len, self.tables)) + 1
        self.table_array = np.zeros((n, 1 << (width - 1).bit_length()), np.int32)
        for r, table in enumerate(self.tables):
            self.table_array[r, : len(table)] = table
        self.width = width - 1  # columns in use
        # the next step's input ids, kept (deriving them from token_lists costs ~10 us a step on this path)
        self.last_token = list(map(itemgetter(-1), self.token_lists))
        self.stop_rows = [r for r, seq in enumerate(seqs) if seq.stop_ids]
        self.processed_rows = [r for r, seq in enumerate(seqs) if seq.needs_processing]
        # (seq_id, temperature, top_k, top_p, seed, num_logprobs) columns, as StepInput wants them
        self.sampling = list(map(list, zip(*map(attrgetter("sampling_row"), seqs))))
        self._row_lists()

    @property
    def in_flight(self) -> int:
        """Steps scheduled and not yet advanced: 1 normally, 2 while one is scheduled ahead (async)."""
        return self.t_claim - self.t

    def _row_lists(self) -> None:
        """Lists that only change when rows are removed (shared by the steps' inputs, never mutated)."""
        n, bs = len(self.seqs), self.block_size
        self.scheduled = list(zip(self.seqs, repeat(1)))
        self.query_start_loc, self.rows = list(range(n + 1)), list(range(n))
        self.next_finish = int(self.finish_t.min()) if n else 0
        self.pos0 = self.base[0].tolist()
        # rows by phase: the rows starting a block at step t are by_phase[-t % bs], no per-step search
        self.by_phase: list[list[int]] = [[] for _ in range(bs)]
        for r, p in enumerate(self.pos0):
            self.by_phase[p % bs].append(r)

    def claim_blocks(self, block_manager: BlockManager) -> bool:
        """Schedule step t_claim: give the rows that start a block a new block (if they lack one) and their slot;
        compute the step's columns. False (nothing changed) if the free blocks are too few: the general path
        preempts. Claimed ahead, a row that the step in flight finishes computes one token more, which is
        dropped; it is then at position max_num_tokens - 1 at most, so never past max_model_len."""
        bs, t, tables, slots = self.block_size, self.t_claim, self.tables, self.base[2]
        rows = self.by_phase[-t % bs]
        if rows:
            positions = [self.pos0[r] + t for r in rows]
            need = [r for r, p in zip(rows, positions) if len(tables[r]) * bs == p]
            if need and self.in_flight and (self.finish_t[need] <= t).any():
                return False  # a row the step in flight ends (length) would evict a cached block it never writes
            if need and not self._append_blocks(need, block_manager):
                return False
            for r, p in zip(rows, positions):
                slots[r] = tables[r][p // bs] * bs - t
        self.columns = (self.base + t).tolist()  # [positions, seq_lens, slots]
        self.t_claim = t + 1
        return True

    def _append_blocks(self, rows: list[int], block_manager: BlockManager) -> bool:
        if not block_manager.append_one_block_each([self.seqs[r] for r in rows]):
            return False
        cols = [len(self.tables[r]) - 1 for r in rows]
        self.width = max(self.width, max(cols) + 1)
        if self.width > self.table_array.shape[1]:
            grown = np.zeros((len(self.seqs), 2 * self.table_array.shape[1]), np.int32)
            grown[:, : self.table_array.shape[1]] = self.table_array
            self.table_array = grown
        self.table_array[rows, cols] = [self.tables[r][c] for r, c in zip(rows, cols)]
        return True

    def step_columns(self) -> dict[str, list]:
        """StepInput fields of the step just claimed (row i = self.seqs[i], one logits row each). A step claimed
        ahead has placeholder input ids (-1): its tokens are the step in flight's, still on the device."""
        positions, seq_lens, slots = self.columns
        seq_ids, temperature, top_k, top_p, seeds, num_logprobs = self.sampling
        input_ids = [-1] * len(self.seqs) if self.in_flight == 2 else self.last_token
        return dict(
            input_ids=input_ids, positions=positions, slot_mapping=slots, query_start_loc=self.query_start_loc,
            seq_lens=seq_lens, block_tables=list(self.tables), logits_indices=self.rows, sample_seq_ids=seq_ids,
            sample_rows=self.rows, temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds,
            counters=seq_lens, num_logprobs=num_logprobs, block_table_array=self.table_array[:, : self.width],
            processed=[self.seqs[r].processed_row(r) for r in self.processed_rows],
        )

    def advance(self, tokens: list[int]) -> tuple[list[int], list[tuple[int, str]]]:
        """Append each row's token of step t; returns (rows whose last block became full, [(row, finish reason)])."""
        seqs = self.seqs
        # num_computed_tokens after step t: the claimed step's sequence lengths, unless one was claimed since
        seq_lens = self.columns[1] if self.in_flight == 1 else (self.base[1] + self.t).tolist()
        # any(map(...)) runs each call in a C loop (they all return None): the per-sequence writes, ~50 ns each
        any(map(list.append, self.token_lists, tokens))
        any(map(setattr, seqs, repeat("num_computed_tokens"), seq_lens))
        self.last_token = tokens
        self.t = t = self.t + 1
        full_rows = self.by_phase[-t % self.block_size]  # a row whose block just filled starts one at this new t
        # the general path's rule (Scheduler._finish_reason): a stop token first, then the length limit
        stopped = {r for r in self.stop_rows if tokens[r] in seqs[r].stop_ids}
        too_long = np.flatnonzero(self.finish_t <= t).tolist() if t >= self.next_finish else []
        finished = [(r, "stop") for r in stopped] + [(r, "length") for r in too_long if r not in stopped]
        return full_rows, sorted(finished)

    def remove_rows(self, rows: list[int]) -> None:
        """Drop finished rows, keeping the order of the others (the scheduler's running order)."""
        if not rows:
            return
        keep = np.ones(len(self.seqs), dtype=bool)
        keep[rows] = False
        kept = keep.tolist()
        self.base, self.finish_t, self.table_array = self.base[:, keep], self.finish_t[keep], self.table_array[keep]
        for name in ("seqs", "last_token", "token_lists", "tables"):
            setattr(self, name, [x for x, k in zip(getattr(self, name), kept) if k])
        self.sampling = [[v for v, k in zip(col, kept) if k] for col in self.sampling]
        self.width = max(map(len, self.tables), default=0)
        new_row = (np.cumsum(keep) - 1).tolist()
        self.stop_rows = [new_row[r] for r in self.stop_rows if kept[r]]
        self.processed_rows = [new_row[r] for r in self.processed_rows if kept[r]]
        self._row_lists()
