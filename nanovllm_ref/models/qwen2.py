"""Qwen2: the Qwen3 decoder with a bias on q/k/v and no q/k RMSNorm (transformers' `Qwen2ForCausalLM`)."""

from __future__ import annotations

from ..config import ModelConfig
from .qwen3 import Qwen3ForCausalLM


class Qwen2ForCausalLM(Qwen3ForCausalLM):
    def arch_flags(self, cfg: ModelConfig) -> dict:
        return {**super().arch_flags(cfg), "qkv_bias": True, "o_bias": False, "qk_norm": False}
