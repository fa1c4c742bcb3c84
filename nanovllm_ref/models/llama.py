"""Llama (2, 3, 3.x with "llama3" RoPE scaling) and Mistral: the same pre-norm GQA decoder as Qwen3 without
q/k norms, with optional attention/MLP biases (transformers' `LlamaForCausalLM`, `MistralForCausalLM`).

Mistral's sliding window is not implemented: the engine refuses a max_model_len beyond the window
(config.resolve_spec), so nothing is ever computed with full attention where the model expects a
window.
"""

from __future__ import annotations

from ..config import ModelConfig
from .qwen3 import Qwen3ForCausalLM


class LlamaForCausalLM(Qwen3ForCausalLM):
    def arch_flags(self, cfg: ModelConfig) -> dict:
        return {**super().arch_flags(cfg), "qk_norm": False, "mlp_bias": cfg.mlp_bias}


class MistralForCausalLM(LlamaForCausalLM):
    pass
