"""Intrinsic invariants of the block manager, checked after every step by both state machines."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from nanovllm_ref.engine.block_manager import BlockManager, hash_block
from nanovllm_ref.engine.sequence import Sequence

from .prop_common import check, name


def chained_hashes(tokens: list[int], block_size: int, num_blocks: int) -> list[int]:
    """The chained hash of each of the first `num_blocks` full blocks of `tokens`, recomputed from scratch."""
    hashes, parent = [], 0
    for i in range(num_blocks):
        parent = hash_block(parent, tokens[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


def check_block_manager(bm: BlockManager, live: Iterable[Sequence]) -> None:
    """Ref counts, accounting, placement, hash-map soundness, and hashing of computed blocks."""
    live = list(live)
    holders: Counter[int] = Counter()
    for seq in live:
        check(len(set(seq.block_table)) == len(seq.block_table), "placement",
              f"{name(seq)} holds a block twice: {seq.block_table}")
        holders.update(seq.block_table)
    for block in bm.blocks:
        check(block.ref_count == holders[block.block_id], "refcount",
              f"block {block.block_id} has ref_count {block.ref_count} but {holders[block.block_id]} live holders")
    free = list(bm.free_queue)
    used = [b.block_id for b in bm.blocks if b.ref_count > 0]
    check(len(free) + len(used) == bm.num_blocks, "accounting",
          f"{len(free)} free + {len(used)} used != {bm.num_blocks} blocks")
    check(bm.num_free_blocks == len(free), "accounting", "num_free_blocks disagrees with the free queue")
    in_tables = set(holders)
    both = in_tables.intersection(free)
    check(not both, "placement", f"blocks {sorted(both)} are both free and in a live block table")
    for h, block_id in bm.cached.items():
        block = bm.blocks[block_id]
        check(block.hash == h and len(block.token_ids) == bm.block_size, "hash-map",
              f"map entry {h:#x} -> block {block_id}, which holds hash {block.hash} tokens {block.token_ids}")
        check(hash_block(block.parent_hash, list(block.token_ids)) == h, "hash-map",
              f"block {block_id}'s tokens {block.token_ids} and parent hash do not hash to its map key")
    bs = bm.block_size
    for seq in live:
        num_full = seq.num_computed_tokens // bs
        want = chained_hashes(seq.token_ids, bs, num_full)
        check(seq.block_hashes == want, "hashed",
              f"{name(seq)} with {seq.num_computed_tokens} computed tokens has block_hashes "
              f"{len(seq.block_hashes)} long, want the {num_full} chained hashes of its full blocks")
        if not bm.enable_prefix_caching:
            continue
        for i, h in enumerate(want):
            block = bm.blocks[seq.block_table[i]]
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            check(block.hash == h and block.token_ids == tokens, "hashed",
                  f"full computed block {i} (id {block.block_id}) of {name(seq)} is not hashed with its "
                  f"tokens {tokens}: hash {block.hash}, tokens {block.token_ids}")
