"""Qwen3 and, through flags, Qwen2, Llama and Mistral: a pre-norm decoder with GQA, RoPE and SwiGLU.

Follows transformers' `modeling_qwen3.py` arithmetic (RMSNorm on q/k per head before RoPE, residual adds
in the model dtype) with packed qkv / gate_up projections and TP-sharded layers. References: Qwen3
technical report; transformers `Qwen3ForCausalLM`; nano-vllm `qwen3.py`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention import BACKENDS
from ..config import ModelConfig, Plan
from ..kernels.activation import silu_and_mul, silu_and_mul_reference
from ..layers.attention import Attention
from ..layers.embedding import ParallelLMHead, VocabParallelEmbedding
from ..layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from ..layers.norm import RMSNorm
from ..layers.rotary import rope_cos_sin_table


class DecoderAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, plan: Plan, flags: dict, cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, self.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, flags["qkv_bias"], plan
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            cfg.num_attention_heads * self.head_dim, cfg.hidden_size, flags["o_bias"], plan
        )
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, plan) if flags["qk_norm"] else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, plan) if flags["qk_norm"] else None
        scale = self.head_dim**-0.5
        backend = BACKENDS[plan.backend](self.num_heads, self.num_kv_heads, self.head_dim, scale, plan)
        self.attn = Attention(backend, cos_sin_cache)  # the backend owns the epilogue: q/k norm, RoPE, KV store

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)  # (num_tokens, (heads + 2 * kv_heads) * head_dim)
        out = self.attn(qkv, positions, self.q_norm, self.k_norm)  # (num_tokens, num_heads, head_dim)
        return self.o_proj(out.reshape(x.shape[0], self.num_heads * self.head_dim))


class DecoderMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, bias: bool, plan: Plan) -> None:
        super().__init__()
        inter = cfg.intermediate_size
        # gate_proj (shard 0) and up_proj (shard 1) in one matrix
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, {0: (inter, 1), 1: (inter, 1)}, bias, plan)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, bias, plan)
        self.act = silu_and_mul if plan.use_kernels else silu_and_mul_reference  # the Triton kernel on CUDA

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))  # (n, 2 * inter) -> SwiGLU (n, inter) -> (n, hidden)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, plan: Plan, flags: dict, cos_sin_cache: torch.Tensor,
                 mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(cfg, plan, flags, cos_sin_cache)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, plan)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, plan)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Qwen3ForCausalLM(nn.Module):
    """transformers' `Qwen3ForCausalLM`: q/k RMSNorm, no qkv bias. (Every architecture's config.json fields that
    no model here implements are refused when it is read: ModelConfig.from_hf.)"""

    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def arch_flags(self, cfg: ModelConfig) -> dict:
        bias = cfg.attention_bias
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": True, "mlp_bias": False}

    def __init__(self, cfg: ModelConfig, plan: Plan) -> None:
        """Built for `plan` (config.Plan): every layer picks its functions from it here, never per call."""
        super().__init__()
        flags = self.arch_flags(cfg)
        # one RoPE table shared by the layers (Qwen3-0.6B: 40,960 positions x 128 float32 = 21 MB, not 28 x that)
        rope = rope_cos_sin_table(cfg.head_dim, cfg.max_position_embeddings, dict(cfg.rope_parameters))
        layers = [DecoderLayer(cfg, plan, flags, rope, self.make_mlp(cfg, i, flags, plan))
                  for i in range(cfg.num_hidden_layers)]
        # transformers' module tree, so that the parameters have the checkpoint's names (model.layers.0. ...)
        self.model = nn.ModuleDict(dict(embed_tokens=VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size),
                                        layers=nn.ModuleList(layers),
                                        norm=RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, plan)))
        self.tie_word_embeddings = cfg.tie_word_embeddings
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, plan)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, flags: dict, plan: Plan) -> nn.Module:
        """The MLP of layer `layer_idx` (dense SwiGLU here; per-layer choices in subclasses, e.g. MoE)."""
        return DecoderMLP(cfg, flags["mlp_bias"], plan)

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        """The parameter a checkpoint tensor loads into, and which of its parts (None: all of it)."""
        for src, (dst, shard_id) in self.packed_modules_mapping.items():
            if f".{src}." in name:
                return name.replace(f".{src}.", f".{dst}."), shard_id
        return name, None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.model.embed_tokens(input_ids), None  # (num_tokens, hidden)
        for layer in self.model.layers:
            x, residual = layer(positions, x, residual)
        x, _ = self.model.norm(x, residual)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        return self.lm_head(hidden)


class Qwen2ForCausalLM(Qwen3ForCausalLM):
    """transformers' `Qwen2ForCausalLM`: the Qwen3 decoder with a bias on q/k/v and no q/k RMSNorm."""

    def arch_flags(self, cfg: ModelConfig) -> dict:
        return {**super().arch_flags(cfg), "qkv_bias": True, "o_bias": False, "qk_norm": False}


class LlamaForCausalLM(Qwen3ForCausalLM):
    """transformers' `LlamaForCausalLM` (Llama 2, 3, 3.x with "llama3" RoPE scaling): the Qwen3 decoder without
    q/k norms, with optional attention/MLP biases."""

    def arch_flags(self, cfg: ModelConfig) -> dict:
        return {**super().arch_flags(cfg), "qk_norm": False, "mlp_bias": cfg.mlp_bias}


class MistralForCausalLM(LlamaForCausalLM):
    """transformers' `MistralForCausalLM`: Llama's decoder. Its sliding window is not implemented: the engine
    refuses a max_model_len beyond the window (config.resolve_spec), so nothing is ever computed with full
    attention where the model expects a window."""
