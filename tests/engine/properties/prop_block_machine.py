"""Stateful model of the block manager: allocate (with and without prefix hits), compute, grow, free, evict.

Each live sequence is driven like the scheduler drives it: `allocate` for a chunk of new tokens, then the
chunk is "computed" (num_computed_tokens advances and `cache_full_blocks` hashes what became full). When
all known tokens are computed, growing a sequence first appends a sampled token, like a decode step.
Everything the block manager answers is compared with `CacheModel`, a reference kept by the test.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nanovllm_ref.engine.block_manager import BlockManager
from nanovllm_ref.engine.sequence import Sequence
from nanovllm_ref.sampling_params import SamplingParams

from .prop_cache_model import CacheModel
from .prop_common import PROMPT_TOKENS, build_prompt, check, describe, name
from .prop_invariants import check_block_manager

PICK = st.integers(0, 15)  # picks a live sequence (modulo how many there are)


@dataclass
class Live:
    seq: Sequence
    pending: int = 0  # tokens allocated for but not yet computed


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm: BlockManager | None = None
        self.model: CacheModel | None = None
        self.live: list[Live] = []
        self.history: list[tuple[int, ...]] = []  # token lists seen so far, to build prompts sharing them
        self._fresh = itertools.count(1000)  # tokens no prompt contains: filler sequences never hit
        self._names = itertools.count()

    def __repr__(self) -> str:
        if self.bm is None:
            return "BlockManagerMachine(uninitialized)"
        return (f"BlockManagerMachine(blocks={self.bm.num_blocks}, bs={self.bm.block_size}, "
                f"free={list(self.bm.free_queue)}, live={[describe(lv.seq) for lv in self.live]})")

    @initialize(num_blocks=st.integers(1, 16), block_size=st.integers(1, 4),
                prefix_caching=st.sampled_from([True, True, False]))
    def setup(self, num_blocks: int, block_size: int, prefix_caching: bool) -> None:
        self.bm = BlockManager(num_blocks, block_size, prefix_caching)
        self.model = CacheModel(num_blocks, block_size, prefix_caching)

    # ---- helpers ---------------------------------------------------------------------------------
    def _snapshot(self) -> tuple:
        bm = self.bm
        return (list(bm.free_queue), dict(bm.cached), [b.ref_count for b in bm.blocks],
                [(b.hash, b.token_ids) for b in bm.blocks])

    def _allocate(self, seq: Sequence, num_new: int, cached: list[int]) -> bool:
        """Allocate through the block manager, checking the outcome against the model."""
        bm, model = self.bm, self.model
        take = model.blocks_to_take(len(seq.block_table), seq.num_computed_tokens, cached, num_new)
        before, old_table, old_computed = self._snapshot(), list(seq.block_table), seq.num_computed_tokens
        ok = bm.allocate(seq, num_new, cached)
        check(ok == (take is not None), "allocate",
              f"allocate({num_new} tokens, {len(cached)} cached) returned {ok}; the model predicts "
              f"{'success' if take is not None else 'failure'} with {model.num_free} free blocks")
        if not ok:
            check(self._snapshot() == before and seq.block_table.tolist() == old_table
                  and seq.num_computed_tokens == old_computed, "allocate", "a failed allocate changed state")
            return False
        n_old = len(old_table)
        table = seq.block_table.tolist()
        check(table[:n_old] == old_table and table[n_old : n_old + len(cached)] == cached,
              "allocate", f"block table {seq.block_table.tolist()} does not extend {old_table} with cached {cached}")
        new_blocks = seq.block_table[n_old + len(cached) :]
        check(len(new_blocks) == take, "allocate", f"took {len(new_blocks)} new blocks, want {take}")
        model.revive(cached)
        error = model.take(new_blocks)
        check(error is None, "lru", f"eviction order: {error}")
        return True

    def _pick(self, which: int, pending: bool) -> Live:
        candidates = [lv for lv in self.live if (lv.pending > 0) == pending]
        return candidates[which % len(candidates)]

    def _has(self, pending: bool) -> bool:
        return any((lv.pending > 0) == pending for lv in self.live)

    # ---- rules -----------------------------------------------------------------------------------
    @rule(reuse=st.none() | st.integers(0, 31), cut=st.integers(0, 10),
          extra=st.lists(PROMPT_TOKENS, max_size=6), chunk=st.integers(1, 16), prompt_logprobs=st.booleans())
    def admit(self, reuse: int | None, cut: int, extra: list[int], chunk: int, prompt_logprobs: bool) -> None:
        """A new sequence: query the prefix cache, then allocate the hits plus a first chunk."""
        tokens = build_prompt(self.history, reuse, cut, extra)
        params = SamplingParams(max_tokens=1, prompt_logprobs=1 if prompt_logprobs else None)
        seq = Sequence(f"s{next(self._names)}", tokens, params, seed=0)
        want = self.model.predict_hits(tokens, seq.uses_prefix_cache)
        hits = self.bm.find_cached_prefix(seq)
        check(len(hits) * self.bm.block_size < len(tokens), "prefix-hit-leaves-a-token",
              f"{len(hits)} cached blocks cover all {len(tokens)} tokens: nothing left to compute")
        check(hits == want, "prefix-hits", f"tokens {tokens}: find_cached_prefix gave {hits}, model {want}")
        num_new = min(chunk, len(tokens) - len(hits) * self.bm.block_size)
        ok = self._allocate(seq, num_new, hits)
        note(f"admit {tokens}: hits {hits}, chunk {num_new} -> {describe(seq) if ok else 'no room'}")
        if ok:
            check(seq.num_computed_tokens == len(hits) * self.bm.block_size, "allocate",
                  f"num_computed_tokens {seq.num_computed_tokens} after {len(hits)} cached blocks")
            self.live.append(Live(seq, num_new))
            self.history.append(tuple(tokens))

    @precondition(lambda self: self._has(pending=True))
    @rule(which=PICK)
    def compute(self, which: int) -> None:
        """The model step ran: the allocated chunk's KV is written; full blocks get hashed."""
        lv = self._pick(which, pending=True)
        seq, first = lv.seq, len(lv.seq.block_hashes)
        seq.num_computed_tokens += lv.pending
        lv.pending = 0
        self.bm.cache_full_blocks(seq)
        self.model.computed(seq.token_ids, seq.block_table, first, seq.num_computed_tokens // self.bm.block_size)
        note(f"compute -> {describe(seq)}")

    @precondition(lambda self: self._has(pending=False))
    @rule(which=PICK, n=st.integers(1, 8), token=PROMPT_TOKENS)
    def grow(self, which: int, n: int, token: int) -> None:
        """Schedule more tokens of a sequence: decode (append a sampled token first) or the next chunk."""
        lv = self._pick(which, pending=False)
        seq = lv.seq
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(token)
        n = min(n, seq.num_tokens - seq.num_computed_tokens)
        ok = self._allocate(seq, n, [])
        note(f"grow {name(seq)} by {n} -> {describe(seq) if ok else 'no room'}")
        if ok:
            lv.pending = n

    @precondition(lambda self: bool(self.live))
    @rule(which=PICK)
    def free(self, which: int) -> None:
        lv = self.live.pop(which % len(self.live))
        self.history.append(tuple(lv.seq.token_ids))
        table = list(lv.seq.block_table)
        self.bm.free(lv.seq)
        self.model.free(table)
        check(not lv.seq.block_table and lv.seq.num_computed_tokens == 0, "free", "free left state on the seq")
        note(f"free {name(lv.seq)} (blocks {table})")

    @rule(num_blocks=st.integers(1, 4))
    def evict(self, num_blocks: int) -> None:
        """A filler sequence of never-seen tokens takes free blocks (evicting cached content, LRU first), then goes."""
        tokens = [next(self._fresh) for _ in range(num_blocks * self.bm.block_size)]
        seq = Sequence(f"filler{next(self._names)}", tokens, SamplingParams(max_tokens=1), seed=0)
        evicted_before = len(self.model.evicted)
        ok = self._allocate(seq, len(tokens), [])
        note(f"evict: filler of {num_blocks} blocks -> {'ok' if ok else 'no room'}; "
             f"evicted {self.model.evicted[evicted_before:]}")
        if ok:  # the filler is dropped at once: its blocks return to the free queue, holding nothing
            table = list(seq.block_table)
            self.bm.free(seq)
            self.model.free(table)

    # ---- invariants ------------------------------------------------------------------------------
    @invariant()
    def consistent(self) -> None:
        bm, model = self.bm, self.model
        if bm is None:
            return
        check_block_manager(bm, [lv.seq for lv in self.live])
        hashed_free = [b for b in bm.free_queue if bm.blocks[b].hash is not None]
        plain_free = [b for b in bm.free_queue if bm.blocks[b].hash is None]
        check(list(bm.free_queue) == plain_free + hashed_free, "lru",
              f"uncached free blocks must be handed out before cached ones: queue {list(bm.free_queue)}")
        check(hashed_free == model.free_lru, "lru",
              f"cached free blocks in eviction order {hashed_free}, model (least recently freed first) "
              f"{model.free_lru}")
        check(bm.cached == model.expected_map(), "cache-model",
              f"findable content differs from the model: {len(bm.cached)} vs {len(model.index)} entries")
        check((bm.num_hits, bm.num_queries) == (model.hits, model.queries), "prefix-hits",
              f"hit/query counters {(bm.num_hits, bm.num_queries)}, model {(model.hits, model.queries)}")
