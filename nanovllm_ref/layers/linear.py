"""Tensor-parallel linear layers with load-time sharding (Megatron-LM's column/row split).

Each parameter carries a `weight_loader(param, loaded, shard_id)` that copies this rank's slice of a full
checkpoint tensor, so the loader never needs to know about TP. Column-parallel layers split the output
features; row-parallel layers split the input features and all-reduce, so one attention or MLP block
costs one all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed import all_reduce, divide, tp_rank, tp_size
from ..kernels.matmul import batch_invariant_linear


def check_shape(param: nn.Parameter, loaded: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise ValueError(f"shape mismatch: checkpoint has {tuple(loaded.shape)}, model expects {tuple(expected)}")


class LinearBase(nn.Module):
    batch_invariant = False  # set by the engine's batch_invariant mode: a row's result independent of the others

    def __init__(self, input_size: int, output_size: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False) if bias else None
        for param in self.parameters():  # the loader copies a checkpoint tensor through its parameter's weight_loader
            param.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        check_shape(param, loaded, param.shape)
        param.data.copy_(loaded)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return (batch_invariant_linear if self.batch_invariant else F.linear)(x, self.weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Splits output features across ranks; the output stays sharded."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, divide(output_size, tp_size(), "output size"), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        offset, size, start, full = self.shard(shard_id, param.shape[0])
        check_shape(param, loaded, (full, *param.shape[1:]))
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, start, size))

    def shard(self, shard_id: object, rows: int) -> tuple[int, int, int, int]:
        """Where checkpoint part `shard_id` goes: (first row in this rank's `rows`, rows, first row in the
        checkpoint tensor, the checkpoint tensor's rows)."""
        return 0, rows, tp_rank() * rows, rows * tp_size()


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stored in one matrix (gate_proj and up_proj -> gate_up_proj)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def shard(self, shard_id: object, rows: int) -> tuple[int, int, int, int]:
        size = self.output_sizes[shard_id] // tp_size()
        return sum(self.output_sizes[:shard_id]) // tp_size(), size, tp_rank() * size, self.output_sizes[shard_id]


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matrix; heads split across ranks, KV heads replicated when
    there are fewer KV heads than ranks (each rank keeps the KV head its query heads read)."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool) -> None:
        tp = tp_size()
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, tp, "num_attention_heads")
        if num_kv_heads >= tp:
            self.num_kv_heads = divide(num_kv_heads, tp, "num_key_value_heads")
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = divide(tp, num_kv_heads, "tensor_parallel_size vs num_key_value_heads")
        self.total_num_kv_heads = num_kv_heads
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden, out, bias)

    def shard(self, shard_id: object, rows: int) -> tuple[int, int, int, int]:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            return 0, q_size, tp_rank() * q_size, q_size * tp_size()
        offset = q_size if shard_id == "k" else q_size + kv_size
        return offset, kv_size, (tp_rank() // self.kv_replicas) * kv_size, self.total_num_kv_heads * self.head_dim


class RowParallelLinear(LinearBase):
    """Splits input features across ranks and sums the partial products (one all-reduce)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(divide(input_size, tp_size(), "input size"), output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object = None) -> None:
        if param.dim() == 1:  # the bias is added once, after the reduction: every rank holds all of it
            return super().weight_loader(param, loaded)
        cols = param.shape[1]
        check_shape(param, loaded, (param.shape[0], cols * tp_size()))
        param.data.copy_(loaded.narrow(1, tp_rank() * cols, cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return self.matmul(x, self.bias)
        y = all_reduce(self.matmul(x, None))
        return y + self.bias if self.bias is not None else y
