"""Vocab-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary.

The embedding masks ids outside its slice and all-reduces; the LM head gathers the logit shards on
rank 0, the only rank that samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import REFERENCE_PLAN, Plan
from ..distributed import all_reduce, gather_last_dim_to_first_rank, tp_rank, tp_size
from ..kernels.matmul import linear_op
from .linear import check_shape


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.shard = -(-vocab_size // tp_size())  # last rank's slice is padded
        self.start = tp_rank() * self.shard
        self.weight = nn.Parameter(torch.empty(self.shard, hidden), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        check_shape(loaded, (self.vocab_size, *param.shape[1:]))
        part = loaded[self.start : self.start + self.shard]
        param.data.zero_()
        param.data[: part.shape[0]].copy_(part)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        inside = (local >= 0) & (local < self.shard)
        y = F.embedding(local.clamp(0, self.shard - 1), self.weight) * inside.unsqueeze(-1)
        return all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(self, vocab_size: int, hidden: int, plan: Plan = REFERENCE_PLAN) -> None:
        super().__init__(vocab_size, hidden)
        self.product = linear_op(plan.batch_invariant, plan.use_kernels)  # as LinearBase's

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:  # (n, vocab) on rank 0
        logits = gather_last_dim_to_first_rank(self.product(hidden, self.weight))
        return None if logits is None else logits[:, : self.vocab_size]
