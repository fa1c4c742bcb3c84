"""Qwen3 and, through flags, Qwen2, Llama and Mistral: a pre-norm decoder with GQA, RoPE and SwiGLU.

Follows transformers' `modeling_qwen3.py` arithmetic (RMSNorm on q/k per head before RoPE, residual adds
in the model dtype) with packed qkv / gate_up projections and TP-sharded layers. References: Qwen3
technical report; transformers `Qwen3ForCausalLM`; nano-vllm `qwen3.py`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionBackend, get_forward_context
from ..config import ModelConfig
from ..kernels.activation import silu_and_mul, silu_and_mul_reference
from ..kernels.rmsnorm import rms_norm_reference
from ..kernels.rotary import rotary_tables, rotate
from ..layers.attention import Attention
from ..layers.embedding import ParallelLMHead, VocabParallelEmbedding
from ..layers.linear import ColumnParallelLinear, LinearBase, QKVParallelLinear, RowParallelLinear
from ..layers.norm import RMSNorm
from ..layers.rotary import rope_cos_sin_table

# bytes of q/k rows the CPU path norms and rotates at once: its temporaries stay in a core's L2 cache (a prompt
# step's 5,141 x 10 x 32 float32 rows: 7-10 ms a layer in blocks of 256 KB against 14-17 ms in one pass)
CPU_BLOCK_BYTES = 256 * 1024


class DecoderAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend_cls: type[AttentionBackend], flags: dict,
                 cos_sin_cache: torch.Tensor) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, self.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, flags["qkv_bias"]
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            cfg.num_attention_heads * self.head_dim, cfg.hidden_size, flags["o_bias"]
        )
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if flags["qk_norm"] else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if flags["qk_norm"] else None
        self.cos_sin_cache = cos_sin_cache  # one RoPE table for all layers
        self.qk_norm_weight: torch.Tensor | None = None  # (heads + kv_heads, head_dim): q's and k's, for _cpu_qk
        scale = self.head_dim**-0.5
        self.attn = Attention(backend_cls(self.num_heads, self.num_kv_heads, self.head_dim, scale))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape[0], self.head_dim
        qkv = self.qkv_proj(x)  # (num_tokens, (heads + 2 * kv_heads) * head_dim)
        if self.attn.fuses_epilogue(qkv):  # q/k norm, RoPE and the KV store in one kernel
            out = self.attn.forward_packed(qkv, positions, self.cos_sin_cache, self.q_norm, self.k_norm)
        else:  # the references once over queries and keys side by side: half the small ops of a CPU step
            heads, qk_heads = qkv.view(n, -1, d), self.num_heads + self.num_kv_heads  # (num_tokens, all heads, d)
            (q, k), v = self._cpu_qk(positions, heads[:, :qk_heads]), heads[:, qk_heads:]
            out = self.attn(q, k, v)  # (num_tokens, num_heads, head_dim)
        return self.o_proj(out.reshape(n, self.num_heads * d))

    def _cpu_qk(self, positions: torch.Tensor, qk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # qk (num_tokens, num_heads + num_kv_heads, head_dim): every row is normed and rotated on its own
        derived = get_forward_context().derived  # the step's RoPE factors, made by its first layer for all
        cos, sin = derived.get("rope") or (None, None)
        if cos is None:
            cos, sin = derived["rope"] = rotary_tables(positions, self.cos_sin_cache, qk.dtype)
        weight = self.qk_norm_weight
        if self.q_norm is not None and weight is None:  # made once, after the weights are loaded
            d = self.head_dim
            weight = self.qk_norm_weight = torch.cat([self.q_norm.weight.expand(self.num_heads, d),
                                                      self.k_norm.weight.expand(self.num_kv_heads, d)])
        # ~8 full passes over the rows, memory bound: a prompt step runs them a cache-sized block of tokens at a time
        rows = max(1, CPU_BLOCK_BYTES // (qk.shape[1] * qk.shape[2] * qk.element_size()))
        if qk.shape[0] <= rows:  # one block (a decode step): no slices
            out = rotate(rms_norm_reference(qk, weight, self.q_norm.eps) if weight is not None else qk, cos, sin)
        else:
            out = qk.new_empty(qk.shape)
            for a in range(0, qk.shape[0], rows):
                x = qk[a : a + rows]
                if weight is not None:
                    x = rms_norm_reference(x, weight, self.q_norm.eps)
                rotate(x, cos[a : a + rows], sin[a : a + rows], out=out[a : a + rows])
        q, k = out.split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k


class DecoderMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, bias: bool) -> None:
        super().__init__()
        inter = cfg.intermediate_size
        # gate_proj (shard 0) and up_proj (shard 1) in one matrix
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, {0: (inter, 1), 1: (inter, 1)}, bias)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # (n, 2 * inter) -> SwiGLU (n, inter): the Triton kernel on CUDA
        return self.down_proj(silu_and_mul(gate_up) if gate_up.is_cuda else silu_and_mul_reference(gate_up))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend_cls: type[AttentionBackend], flags: dict,
                 cos_sin_cache: torch.Tensor, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(cfg, backend_cls, flags, cos_sin_cache)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

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

    def __init__(self, cfg: ModelConfig, backend_cls: type[AttentionBackend]) -> None:
        super().__init__()
        flags = self.arch_flags(cfg)
        # one RoPE table shared by the layers (Qwen3-0.6B: 40,960 positions x 128 float32 = 21 MB, not 28 x that)
        rope = rope_cos_sin_table(cfg.head_dim, cfg.max_position_embeddings, dict(cfg.rope_parameters))
        layers = [DecoderLayer(cfg, backend_cls, flags, rope, self.make_mlp(cfg, i, flags))
                  for i in range(cfg.num_hidden_layers)]
        # transformers' module tree, so that the parameters have the checkpoint's names (model.layers.0. ...)
        self.model = nn.ModuleDict(dict(embed_tokens=VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size),
                                        layers=nn.ModuleList(layers),
                                        norm=RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)))
        self.tie_word_embeddings = cfg.tie_word_embeddings
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def make_mlp(self, cfg: ModelConfig, layer_idx: int, flags: dict) -> nn.Module:
        """The MLP of layer `layer_idx` (dense SwiGLU here; per-layer choices in subclasses, e.g. MoE)."""
        return DecoderMLP(cfg, flags["mlp_bias"])

    def checkpoint_target(self, name: str) -> tuple[str, object]:
        """The parameter a checkpoint tensor loads into, and which of its parts (None: all of it)."""
        for src, (dst, shard_id) in self.packed_modules_mapping.items():
            if f".{src}." in name:
                return name.replace(f".{src}.", f".{dst}."), shard_id
        return name, None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not input_ids.is_cuda and not getattr(self, "_cpu_layout", False):  # once, after the weights are loaded
            self._cpu_layout = True
            for m in self.modules():
                if isinstance(m, LinearBase) or (m is self.lm_head and not self.tie_word_embeddings):
                    # column-major: `x @ W.T` is then a plain row-major product for the BLAS, the same sums in the
                    # same order (bit for bit here) but 15-25% faster on a decode step's few rows; a reload
                    # copies into this layout
                    m.weight.data = m.weight.data.t().contiguous().t()
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
