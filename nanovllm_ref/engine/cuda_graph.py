"""CUDA graphs for decode steps: one captured forward per batch size over persistent input buffers.

A decode step with n sequences replays the graph of the smallest captured size >= n; the step's inputs
are copied into the persistent buffers in place (no per-step allocation on the device), padded rows get
slot -1 (their K/V is not stored) and context length 0. The block-table buffer is as wide as
ceil(max_model_len / block_size) blocks, so no block table at run time can outgrow the captured shape
(nano-vllm rounded down and crashed). Only the model forward is captured: logits and sampling run eagerly
on the rows that exist.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..attention import AttentionMetadata, forward_context
from ..attention.metadata import decode_batch_bucket
from .inputs import StepInput


def capture_sizes(max_num_seqs: int) -> list[int]:
    return sorted({decode_batch_bucket(n) for n in range(1, min(max_num_seqs, 512) + 1)})


class DecodeGraphs:
    def __init__(self, model: Callable, hidden_size: int, dtype: torch.dtype, device: torch.device,
                 max_num_seqs: int, max_model_len: int, block_size: int) -> None:
        self.sizes = capture_sizes(max_num_seqs)
        n, width = self.sizes[-1], -(-max_model_len // block_size)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, width, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.order = torch.arange(n, dtype=torch.int64, device=device)  # longest context first (decode attention)
        self.identity = torch.arange(n, dtype=torch.int64, device=device)  # padded slots (no context) go last
        self.hidden = torch.empty(n, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.max_model_len = max_model_len  # an upper bound of the context: steers the decode splits
        self._capture(model)

    def _meta(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs], block_tables=self.block_tables[:bs], max_query_len=1,
            max_seq_len=self.max_model_len, decode_order=self.order[:bs],
        )

    @torch.inference_mode()
    def _capture(self, model: Callable) -> None:
        pool = None
        for bs in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory pool
            with forward_context(self._meta(bs)):
                model(self.input_ids[:bs], self.positions[:bs])  # warm-up: Triton compiles outside capture
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.hidden[:bs] = model(self.input_ids[:bs], self.positions[:bs])
            pool = graph.pool() if pool is None else pool
            self.graphs[bs] = graph
        torch.cuda.synchronize()

    def can_run(self, step: StepInput) -> bool:
        return step.max_query_len == 1 and len(step.seq_lens) <= self.sizes[-1]

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Replay the graph for a decode step whose inputs are on the device (ModelRunner's staging): they are
        copied into the persistent buffers, device to device. Returns (num_seqs, hidden)."""
        n, width = meta.block_tables.shape
        bs = next(s for s in self.sizes if s >= n)
        self.input_ids[:n] = input_ids
        self.positions[:n] = positions
        self.slot_mapping[:n] = meta.slot_mapping
        self.seq_lens[:n] = meta.seq_lens
        self.slot_mapping[n:bs], self.seq_lens[n:bs] = -1, 0
        self.block_tables[:n, :width] = meta.block_tables
        self.order[:n], self.order[n:bs] = meta.decode_order, self.identity[n:bs]
        self.graphs[bs].replay()
        return self.hidden[:n]
