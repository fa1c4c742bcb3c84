"""Tensor-parallel linear layers with load-time sharding (Megatron-LM's column/row split).

Each parameter carries a `weight_loader(param, loaded, shard_id)` that copies this rank's slice of a full
checkpoint tensor, so the loader never needs to know about TP. Column-parallel layers split the output
features; row-parallel layers split the input features and all-reduce, so one attention or MLP block
costs one all-reduce.
"""

from __future__ import annotations

import torch
from torch import nn

from ..config import REFERENCE_PLAN, Plan
from ..distributed import all_reduce, divide, rank_kv_heads, tp_rank, tp_size
from ..kernels.matmul import linear_op


def check_shape(loaded: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise ValueError(f"shape mismatch: checkpoint has {tuple(loaded.shape)}, model expects {tuple(expected)}")


def load_whole(param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
    """The weight loader of a parameter every rank holds whole (and of a parameter without one)."""
    check_shape(loaded, param.shape)
    param.data.copy_(loaded)


class LinearBase(nn.Module):
    weight_loader = staticmethod(load_whole)

    def __init__(self, input_size: int, output_size: int, bias: bool, plan: Plan = REFERENCE_PLAN) -> None:
        super().__init__()
        # the engine's batch_invariant mode: a row's result independent of the others (kernels/matmul.py)
        self.product = linear_op(plan.batch_invariant, plan.use_kernels)
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False) if bias else None
        for param in self.parameters():  # the loader copies a checkpoint tensor through its parameter's weight_loader
            param.weight_loader = self.weight_loader

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.product(x, self.weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Splits output features across ranks; the output stays sharded. Its rows may pack several checkpoint tensors
    one after another (`parts`, e.g. gate_proj and up_proj -> gate_up_proj), each split across the ranks on its own."""

    def __init__(self, input_size: int, parts: dict[object, tuple[int, int]], bias: bool = False,
                 plan: Plan = REFERENCE_PLAN) -> None:
        # parts: shard_id -> (the checkpoint tensor's rows, how many consecutive ranks share each slice of it);
        # slices: shard_id -> (first row here, rows, first row in the checkpoint tensor, the tensor's rows)
        self.slices: dict[object, tuple[int, int, int, int]] = {}
        offset = 0
        for shard_id, (full, sharing) in parts.items():
            rows = divide(full * sharing, tp_size(), "output size")
            self.slices[shard_id] = (offset, rows, tp_rank() // sharing * rows, full)
            offset += rows
        super().__init__(input_size, offset, bias, plan)
        for param in self.parameters():  # the loader checks that every part was loaded
            param.shard_ids = set(parts)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if shard_id not in self.slices:  # a checkpoint tensor that packs the parts already
            raise ValueError(f"the model loads this parameter from one tensor per part {list(self.slices)}")
        offset, rows, start, full = self.slices[shard_id]
        check_shape(loaded, (full, *param.shape[1:]))
        param.data.narrow(0, offset, rows).copy_(loaded.narrow(0, start, rows))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matrix; heads split across ranks, KV heads replicated when
    there are fewer KV heads than ranks (each rank keeps the KV head its query heads read)."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool,
                 plan: Plan = REFERENCE_PLAN) -> None:
        tp = tp_size()
        self.num_heads, self.num_kv_heads = num_heads // tp, len(rank_kv_heads(num_heads, num_kv_heads, tp_rank(), tp))
        kv = (num_kv_heads * head_dim, tp * self.num_kv_heads // num_kv_heads)  # (ranks sharing a KV head)
        super().__init__(hidden, {"q": (num_heads * head_dim, 1), "k": kv, "v": kv}, bias, plan)


class RowParallelLinear(LinearBase):
    """Splits input features across ranks and sums the partial products (one all-reduce)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, plan: Plan = REFERENCE_PLAN) -> None:
        super().__init__(divide(input_size, tp_size(), "input size"), output_size, bias, plan)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if param.dim() == 1:  # the bias is added once, after the reduction: every rank holds all of it
            return load_whole(param, loaded)
        cols = param.shape[1]
        check_shape(loaded, (param.shape[0], cols * tp_size()))
        param.data.copy_(loaded.narrow(1, tp_rank() * cols, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return self.matmul(x, self.bias)
        y = all_reduce(self.matmul(x, None))
        return y + self.bias if self.bias is not None else y
