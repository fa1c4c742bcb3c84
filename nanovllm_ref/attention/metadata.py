"""Batch metadata for attention, made visible to the attention layers for exactly one forward.

Models keep `forward(input_ids, positions)`; the attention layers read the paged-cache metadata from
`get_forward_context()`, which only works inside `with forward_context(meta):` (nesting is an error), so
metadata can never leak from one step into the next.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (num_tokens,) int64: where each token's K/V goes; -1 = padding
    query_start_loc: torch.Tensor  # (num_seqs + 1,) int32
    seq_lens: torch.Tensor  # (num_seqs,) int32: context length after this step
    block_tables: torch.Tensor  # (num_seqs, max_blocks_per_seq) int32
    max_query_len: int
    max_seq_len: int
    # tensors a backend derives from the fields above, computed by the first layer and reused by the others
    derived: dict[str, Any] = field(default_factory=dict, repr=False)
    decode_order: torch.Tensor | None = None  # (num_seqs,) sequences longest context first (decode attention)
    # a speculative verify step: several rows of one sequence side by side, whose rejected rows' keys a later step
    # rewrites (a backend must carry nothing of this step's keys over to the next)
    verifies_drafts: bool = False

    @property
    def decode_only(self) -> bool:
        return self.max_query_len == 1


def decode_batch_bucket(num_seqs: int) -> int:
    """The padded batch size of a decode step: a power of two up to 8, then a multiple of 16. CUDA graphs
    are captured at these sizes, and split-K decisions use them, so eager and graph runs compute alike."""
    return 1 << (num_seqs - 1).bit_length() if num_seqs <= 8 else -(-num_seqs // 16) * 16


_context: contextvars.ContextVar[AttentionMetadata | None] = contextvars.ContextVar("attn_meta", default=None)


@contextlib.contextmanager
def forward_context(meta: AttentionMetadata) -> Iterator[AttentionMetadata]:
    if _context.get() is not None:
        raise RuntimeError("forward_context is already active: nested forwards are not supported")
    token = _context.set(meta)
    try:
        yield meta
    finally:
        _context.reset(token)


def get_forward_context() -> AttentionMetadata:
    meta = _context.get()
    if meta is None:
        raise RuntimeError("attention called outside `with forward_context(meta):`")
    return meta
