"""Tensor-parallel group helpers over torch.distributed (gloo on CPU, NCCL on GPU); no-ops at TP=1."""

from __future__ import annotations

import torch
import torch.distributed as dist


def tp_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def tp_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    if tp_size() == 1:
        return x
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
        y = x.float()  # gloo reduces half types slowly or not at all; sum in float32 and round once
        dist.all_reduce(y)
        return y.to(x.dtype)
    dist.all_reduce(x)
    return x


def gather_last_dim_to_first_rank(x: torch.Tensor) -> torch.Tensor | None:
    """Concatenate every rank's shard along the last dim on rank 0; other ranks get None."""
    if tp_size() == 1:
        return x
    y = x.float() if x.device.type == "cpu" else x.contiguous()  # gloo gathers float32 reliably
    shards = [torch.empty_like(y) for _ in range(tp_size())] if tp_rank() == 0 else None
    dist.gather(y, shards, dst=0)
    return torch.cat(shards, dim=-1).to(x.dtype) if shards is not None else None


def broadcast_from_first_rank(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's `x` on every rank, in place (a device-side collective: no host sync under NCCL)."""
    if tp_size() > 1:
        dist.broadcast(x, src=0)
    return x


def all_reduce_min(value: int, device: torch.device) -> int:
    """The smallest of every rank's value (so all ranks size their KV cache alike)."""
    if tp_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) is not divisible by tensor_parallel_size ({denominator})")
    return numerator // denominator


def rank_kv_heads(num_heads: int, num_kv_heads: int, rank: int, tp: int) -> list[int]:
    """The KV heads a tensor-parallel rank holds (layers/linear.py, QKVParallelLinear): consecutive ones; when there
    are fewer KV heads than ranks, each is replicated on tp // num_kv_heads consecutive ranks (those whose query
    heads read it). A head count that does not split so is a ValueError naming tensor_parallel_size."""
    if num_heads % tp:
        raise ValueError(f"tensor_parallel_size={tp} must divide num_attention_heads={num_heads}")
    if num_kv_heads % tp and tp % num_kv_heads:
        raise ValueError(f"tensor_parallel_size={tp} and num_key_value_heads={num_kv_heads}: one must divide the other")
    first = rank * num_kv_heads // tp
    return list(range(first, first + max(1, num_kv_heads // tp)))
