"""A step's inputs on the device: the StepInput's arrays (engine/inputs.py, pure Python) packed into one pinned host
buffer and copied with one host-to-device copy, then viewed as the forward's tensors and attention metadata."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..attention import AttentionMetadata
from .inputs import StepInput

_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


def upload(arrays: list[tuple[Any, torch.dtype]], device: torch.device) -> list[torch.Tensor]:
    """(array, dtype) pairs (lists or numpy arrays; int64, int32, float32) on the device with one copy: packed into one
    byte buffer (numpy reads a long list ~4x faster than torch.tensor), viewed on the device in their dtypes (no
    conversion kernels), each 16-byte aligned as a fresh tensor (Triton specializes on pointer alignment: one that
    followed the step's sizes would compile variants mid-run). Pinned on CUDA (torch's caching host allocator reuses
    it once its copy is done): a copy from pageable memory may wait for the stream to drain, stalling the host behind
    the forward it just queued. Fresh each step: CPU backends may keep a step's tensors to compare with the next."""
    sizes = [len(a) * dtype.itemsize for a, dtype in arrays]
    starts = np.cumsum([0] + [-(-n // 16) * 16 for n in sizes]).tolist()
    host = torch.empty(starts[-1], dtype=torch.uint8, pin_memory=device.type == "cuda")
    raw = host.numpy()
    for (a, dtype), start, size in zip(arrays, starts, sizes):
        raw[start:start + size].view(_NUMPY[dtype])[:] = a
    dev = host.to(device, non_blocking=True)
    return [dev[start:start + size].view(dtype) for (_, dtype), start, size in zip(arrays, starts, sizes)]


def stage_step(step: StepInput, device: torch.device, max_model_len: int, rows: np.ndarray | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, torch.Tensor]:
    """An eager step's inputs on the device with one copy: (the host's input ids, positions, attention metadata, logits
    rows, `rows` on the device). `rows` (async scheduling, overlap.py: an int64 array, a row's source among the host's
    ids and the step in flight's tokens) travels in the same copy; empty without it."""
    tables = step.block_tables
    # decode attention takes the longest contexts first; sorted here, a device sort would cost ~18 us a step
    decode = step.max_query_len == 1
    order = np.argsort(-np.asarray(step.seq_lens), kind="stable") if decode else []
    i64, i32 = torch.int64, torch.int32
    ids, positions, slots, starts, seq_lens, flat_tables, logits_rows, rows, order = upload(
        [(step.input_ids, i64), (step.positions, i64), (step.slot_mapping, i64), (step.query_start_loc, i32),
         (step.seq_lens, i32), (tables.ravel(), i32),
         ([] if step.logits_rows_are_all_rows() else step.logits_indices, i64), ([] if rows is None else rows, i64),
         (order, i64)],
        device)
    meta = AttentionMetadata(
        slot_mapping=slots, query_start_loc=starts, seq_lens=seq_lens, block_tables=flat_tables.view(tables.shape),
        max_query_len=step.max_query_len,
        max_seq_len=max_model_len,  # an upper bound, the same in eager and graph runs
        decode_order=order if decode else None, verifies_drafts=bool(step.drafts),
    )
    return ids, positions, meta, logits_rows, rows
