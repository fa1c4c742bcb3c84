"""Llama (2, 3, 3.x with "llama3" RoPE scaling) and Mistral: the same pre-norm GQA decoder as Qwen3 without
q/k norms, with optional attention/MLP biases (transformers' `LlamaForCausalLM`, `MistralForCausalLM`).

Mistral's sliding window is not implemented: the engine refuses a max_model_len beyond the window
(see `check_sliding_window`), so nothing is ever computed with full attention where the model expects a
window.
"""

from __future__ import annotations

from typing import Any

from .qwen3 import Qwen3ForCausalLM


class LlamaForCausalLM(Qwen3ForCausalLM):
    def arch_flags(self, cfg: Any) -> dict:
        bias = bool(getattr(cfg, "attention_bias", False))
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": False, "mlp_bias": bool(getattr(cfg, "mlp_bias", False))}


class MistralForCausalLM(LlamaForCausalLM):
    pass
