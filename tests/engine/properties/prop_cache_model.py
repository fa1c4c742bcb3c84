"""A brute-force reference model of the prefix cache, maintained independently of `BlockManager`.

The model names cached content by its whole token prefix (every token up to the end of the block), not by
hash, and tracks per block: its ref count, the prefix it holds, and where it sits when free. Free blocks
are handed out uncached ones first (in any order), then cached ones least-recently-freed first; handing
out a cached block evicts its content. The state machine feeds the model the same operations as the block
manager and compares: prefix hits, which blocks are taken (eviction order), and the findable content.
"""

from __future__ import annotations

from nanovllm_ref.engine.block_manager import hash_block

Prefix = tuple[int, ...]


class CacheModel:
    def __init__(self, num_blocks: int, block_size: int, enabled: bool) -> None:
        self.block_size = block_size
        self.enabled = enabled
        self.ref = dict.fromkeys(range(num_blocks), 0)
        self.content: dict[int, Prefix] = {}  # block -> token prefix ending with the block (hashed blocks)
        self.index: dict[Prefix, int] = {}  # findable prefixes -> block
        self.free_plain: set[int] = set(range(num_blocks))  # free, holding nothing worth keeping
        self.free_lru: list[int] = []  # free cached blocks, least recently freed first
        self.evicted: list[Prefix] = []  # cached content in the order it disappeared
        self.hits = self.queries = 0
        self._hashes: dict[Prefix, int] = {(): 0}

    @property
    def num_free(self) -> int:
        return len(self.free_plain) + len(self.free_lru)

    def chain_hash(self, prefix: Prefix) -> int:
        """The block manager's key for the last block of `prefix` (a whole number of blocks)."""
        if prefix not in self._hashes:
            parent = self.chain_hash(prefix[: -self.block_size])
            self._hashes[prefix] = hash_block(parent, list(prefix[-self.block_size :]))
        return self._hashes[prefix]

    def expected_map(self) -> dict[int, int]:
        """The block manager's `cached` dict as the model predicts it."""
        return {self.chain_hash(prefix): block for prefix, block in self.index.items()}

    def predict_hits(self, tokens: list[int], uses_cache: bool) -> list[int]:
        """Longest findable run of full blocks, never covering the last token."""
        if not (self.enabled and uses_cache):
            return []
        bs = self.block_size
        num_full = (len(tokens) - 1) // bs
        hits: list[int] = []
        for i in range(num_full):
            block = self.index.get(tuple(tokens[: (i + 1) * bs]))
            if block is None:
                break
            hits.append(block)
        self.queries += num_full
        self.hits += len(hits)
        return hits

    def blocks_to_take(self, table_len: int, computed: int, cached: list[int], num_new_tokens: int) -> int | None:
        """How many free blocks an allocation takes, or None when it must fail (too few free blocks)."""
        total = computed + len(cached) * self.block_size + num_new_tokens
        new = max(-(-total // self.block_size) - table_len - len(cached), 0)
        revived = sum(1 for b in cached if self.ref[b] == 0)
        return None if new + revived > self.num_free else new

    def revive(self, cached: list[int]) -> None:
        for block in cached:
            if self.ref[block] == 0:
                self.free_lru.remove(block)
            self.ref[block] += 1

    def take(self, new_blocks: list[int]) -> str | None:
        """Account for blocks handed out by an allocation; returns why the choice is wrong, if it is."""
        for block in new_blocks:
            if self.free_plain:
                if block not in self.free_plain:
                    return f"took block {block} while uncached free blocks {sorted(self.free_plain)} remain"
                self.free_plain.remove(block)
            else:
                if not self.free_lru or block != self.free_lru[0]:
                    return f"took block {block}, but the least recently freed cached block is {self.free_lru[:1]}"
                self.free_lru.pop(0)
                prefix = self.content.pop(block)
                if self.index.get(prefix) == block:  # a copy computed side by side takes over, the oldest first
                    del self.index[prefix]
                    copy = next((b for b, held in self.content.items() if held == prefix), None)
                    if copy is None:
                        self.evicted.append(prefix)
                    else:
                        self.index[prefix] = copy
            self.ref[block] = 1
        return None

    def computed(self, tokens: list[int], table: list[int], first: int, last: int) -> None:
        """Full blocks `first..last-1` of a sequence became computed: they get hashed and findable."""
        if not self.enabled:
            return
        for i in range(first, last):
            block = table[i]
            if block not in self.content:
                prefix = tuple(tokens[: (i + 1) * self.block_size])
                self.content[block] = prefix
                self.index.setdefault(prefix, block)

    def free(self, table: list[int]) -> None:
        for block in reversed(table):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                if block in self.content:
                    self.free_lru.append(block)
                else:
                    self.free_plain.add(block)
