"""Qwen3-MoE: the Qwen3 decoder with a sparse mixture-of-experts MLP in most layers.

Follows transformers' `modeling_qwen3_moe.py`: the router `gate` (linear, no bias) gives logits in the model
dtype, softmax in float32, top-`num_experts_per_tok`, renormalized when `norm_topk_prob`, cast to the model
dtype, then the weighted sum of the chosen experts' SwiGLU MLPs (`moe_intermediate_size`; kernels/fused_moe.py).
Layer i is sparse when `i not in mlp_only_layers` and `(i + 1) % decoder_sparse_step == 0`, dense
(`intermediate_size`) otherwise. Expert weights are stacked per layer as (E, 2 * I, H) and (E, H, I) for the
grouped kernel; they load from per-expert checkpoint tensors (`mlp.experts.{e}.gate_proj.weight`, what hub
checkpoints and transformers' `save_pretrained` write) or from fused ones (`mlp.experts.gate_up_proj`).
TP (as vLLM's `FusedMoE`): each expert's intermediate dim is split across ranks (gate/up by rows, down by
columns), the router is replicated, and the block ends in one all-reduce.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import torch
from torch import nn

from ..config import ModelConfig, Plan
from ..distributed import all_reduce, divide, tp_rank, tp_size
from ..kernels.fused_moe import fused_moe, fused_moe_ref
from ..kernels.matmul import invariant_linear_reference
from ..layers.linear import ReplicatedLinear, check_shape
from .qwen3 import Qwen3ForCausalLM

EXPERT_TENSOR = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class FusedExperts(nn.Module):
    """All experts of a layer, stacked; this rank holds I / tp of each expert's intermediate features."""

    def __init__(self, num_experts: int, hidden: int, inter: int) -> None:
        super().__init__()
        self.inter, self.full_inter = divide(inter, tp_size(), "moe_intermediate_size"), inter
        i = self.inter
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * i, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, i), requires_grad=False)
        self.gate_up_proj.weight_loader, self.down_proj.weight_loader = self.load_gate_up, self.load_down
        self.gate_up_proj.shard_ids = {(e, j) for e in range(num_experts) for j in (0, 1)}
        self.down_proj.shard_ids = set(range(num_experts))

    def load_gate_up(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[int, int] | None) -> None:
        """shard_id (expert, 0 gate | 1 up) for a per-expert (I, H) tensor; None for the fused (E, 2 * I, H)."""
        i, full = self.inter, self.full_inter
        if shard_id is None:  # each expert's gate rows, then its up rows: (E, gate | up, rows, H)
            check_shape(loaded, (param.shape[0], 2 * full, param.shape[2]))
            dst, loaded = param.data.unflatten(1, (2, i)), loaded.unflatten(1, (2, full))
        else:
            check_shape(loaded, (full, param.shape[2]))
            dst = param.data[shard_id[0]].unflatten(0, (2, i))[shard_id[1]]
        dst.copy_(loaded.narrow(-2, tp_rank() * i, i))

    def load_down(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None) -> None:
        """shard_id = expert for a per-expert (H, I) tensor; None for the fused (E, H, I)."""
        dst = param.data if shard_id is None else param.data[shard_id]
        check_shape(loaded, (*dst.shape[:-1], self.full_inter))
        dst.copy_(loaded.narrow(-1, tp_rank() * self.inter, self.inter))


def moe_op(plan: Plan) -> Callable[..., torch.Tensor]:
    """The experts' product `(x, gate_up, down, weights, ids) -> (T, H)`: the Triton kernel (the plan's kernels,
    CUDA) or the reference; in the engine's batch_invariant mode one expert tile, row-tiled CPU products."""
    if not plan.batch_invariant:
        return fused_moe if plan.use_kernels else fused_moe_ref
    return (functools.partial(fused_moe, invariant=True) if plan.use_kernels else
            functools.partial(fused_moe_ref, linear=invariant_linear_reference))


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, plan: Plan) -> None:
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, bool(cfg.norm_topk_prob)
        self.gate = ReplicatedLinear(cfg.hidden_size, cfg.num_experts, bias=False, plan=plan)
        self.experts = FusedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
        self.experts_op = moe_op(plan)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # (T, E)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)  # (T, K)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        args = (x, self.experts.gate_up_proj, self.experts.down_proj, weights.to(x.dtype), ids)
        return all_reduce(self.experts_op(*args))


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """transformers' `Qwen3MoeForCausalLM` (Qwen3-30B-A3B, Qwen3-235B-A22B): no shared experts (a config that has
    them is refused: ModelConfig.from_hf)."""

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, flags: dict, plan: Plan) -> nn.Module:
        sparse = (layer_idx not in cfg.mlp_only_layers and cfg.num_experts > 0
                  and (layer_idx + 1) % cfg.decoder_sparse_step == 0)
        return SparseMoeBlock(cfg, plan) if sparse else super().make_mlp(cfg, layer_idx, flags, plan)

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        """`...experts.{e}.gate_proj|up_proj|down_proj.weight` -> the stacked parameter and (expert, part)."""
        m = EXPERT_TENSOR.match(name)
        if m is None:
            return super().checkpoint_target(name)
        prefix, expert, proj = m.group(1), int(m.group(2)), m.group(3)
        if proj == "down_proj":
            return f"{prefix}.down_proj", expert
        return f"{prefix}.gate_up_proj", (expert, 0 if proj == "gate_proj" else 1)
