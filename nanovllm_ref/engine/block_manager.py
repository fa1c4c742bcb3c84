"""Paged KV-cache bookkeeping: fixed-size blocks with ref counts and a prefix cache (pure Python, no torch).

Prefix cache (as in vLLM's automatic prefix caching): a full block's key is a chained hash of its parent's
hash and its token ids (Python's 64-bit tuple hash: deterministic for ints, and a third of the cost of packing
the ids for xxhash), and a hit is confirmed by comparing tokens and parent hash exactly, so a hash collision can
never serve wrong KV, only cost a miss. Freed blocks keep their content and stay findable until the free queue
hands them out again, least-recently-freed first; handing a block out drops its stale hash entry, which passes to
a copy of the same content where one is cached (two requests that computed it side by side, one with prompt
logprobs), as vLLM's BlockPool keeps every block of a hash findable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from .sequence import Sequence


def hash_block(parent_hash: int, token_ids: Iterable[int]) -> int:
    return hash((parent_hash, tuple(token_ids)))


@dataclass(slots=True, eq=False)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and computed
    parent_hash: int = 0
    token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order: the first one is handed out (and its cached content evicted) first.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        # hash -> other blocks holding the same content (computed side by side), oldest first: one takes over when
        # the cached one is evicted, so the content stays findable while a copy holds it (vLLM keeps them all)
        self.copies: dict[int, list[int]] = {}
        self.num_hits = self.num_queries = 0  # in blocks, for statistics and tests

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of `seq`, leaving at least one token to compute."""
        if not self.enable_prefix_caching or not seq.uses_prefix_cache:
            return []
        hits: list[int] = []
        parent = 0
        bs = self.block_size
        for i in range((seq.num_tokens - 1) // bs):
            tokens = seq.token_ids[i * bs : (i + 1) * bs]
            h = hash_block(parent, tokens)
            block_id = self.cached.get(h)
            block = None if block_id is None else self.blocks[block_id]
            if block is None or block.parent_hash != parent or block.token_ids != tuple(tokens):
                break
            hits.append(block_id)
            parent = h
        self.num_queries += (seq.num_tokens - 1) // bs
        self.num_hits += len(hits)
        return hits

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int] = ()) -> bool:
        """Give `seq` the cached blocks and enough new blocks for `num_new_tokens` more tokens; all or nothing:
        returns False and changes nothing if the free blocks do not suffice."""
        if not cached_blocks and seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size:
            return True  # fits in the blocks it has (most decode steps)
        total = seq.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_needed(total) - len(seq.block_table) - len(cached_blocks)
        revived = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        if max(num_new_blocks, 0) + revived > self.num_free_blocks:
            return False
        for block_id in cached_blocks:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(block.hash)
        seq.num_computed_tokens += len(cached_blocks) * self.block_size
        seq.block_table.extend(self._take_free_block() for _ in range(num_new_blocks))
        return True

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict: the content is about to be overwritten
            copies = self.copies.get(block.hash, [])
            if self.cached.get(block.hash) == block_id:
                del self.cached[block.hash]
                if copies:
                    self.cached[block.hash] = copies.pop(0)
            elif block_id in copies:
                copies.remove(block_id)
            if not copies:
                self.copies.pop(block.hash, None)
            block.hash, block.parent_hash, block.token_ids = None, 0, ()
        block.ref_count = 1
        return block_id

    def cache_full_blocks(self, *seqs: Sequence) -> None:
        """Hash the blocks of `seqs` that became full and computed, so later requests can share them."""
        bs = self.block_size
        for seq in seqs:
            for i in range(len(seq.block_hashes), seq.num_computed_tokens // bs):
                parent = seq.block_hashes[-1] if seq.block_hashes else 0
                tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                h = hash_block(parent, tokens)
                seq.block_hashes.append(h)
                block = self.blocks[seq.block_table[i]]
                if self.enable_prefix_caching and block.hash is None:
                    block.hash, block.parent_hash, block.token_ids = h, parent, tokens
                    if self.cached.setdefault(h, block.block_id) != block.block_id:
                        self.copies.setdefault(h, []).append(block.block_id)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (benchmarks use it so a round cannot hit the previous round's prompts)."""
        self.cached.clear()
        self.copies.clear()
        for block in self.blocks:
            if block.ref_count == 0:
                block.hash, block.parent_hash, block.token_ids = None, 0, ()

    def free(self, seq: Sequence) -> None:
        # Tail blocks go first in the queue: a prefix is more likely to be shared than a suffix.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None
                if block.hash is None:  # nothing worth keeping: hand it out before cached blocks
                    self.free_queue.move_to_end(block_id, last=False)
        del seq.block_table[:]
        seq.block_hashes = []
        seq.num_computed_tokens = 0
