"""ModelConfig: the typed, frozen architecture read once from a checkpoint's HF config (nanovllm_ref/config.py)."""

from __future__ import annotations

import dataclasses
import types

import pytest

from nanovllm_ref.config import ModelConfig

BASE = dict(architectures=["LlamaForCausalLM"], vocab_size=128, hidden_size=64, intermediate_size=96,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=256)
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)


def test_both_rope_dialects_give_one_config():
    """transformers v5 writes `rope_parameters`; v4 checkpoints carry `rope_theta` + `rope_scaling`."""
    v5 = ModelConfig.from_hf(types.SimpleNamespace(**BASE, rope_parameters={**LLAMA3, "rope_theta": 5e5}))
    v4 = ModelConfig.from_hf(types.SimpleNamespace(**BASE, rope_theta=5e5, rope_scaling=LLAMA3))
    assert v5 == v4
    assert dict(v5.rope_parameters)["rope_theta"] == 5e5 and dict(v5.rope_parameters)["rope_type"] == "llama3"
    plain = ModelConfig.from_hf(types.SimpleNamespace(**BASE))  # neither: RoPE's default base
    assert dict(plain.rope_parameters) == {"rope_theta": 10000.0, "rope_type": "default"}


def test_defaults_and_frozen():
    cfg = ModelConfig.from_hf(types.SimpleNamespace(**BASE, head_dim=None, sliding_window=32, use_sliding_window=False,
                                                    eos_token_id=[1, 2], mlp_only_layers=None))
    assert cfg.head_dim == 16 and cfg.sliding_window is None and cfg.eos_token_id == (1, 2)
    assert cfg.mlp_only_layers == () and cfg.hidden_act == "silu" and not cfg.tie_word_embeddings
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="rope_scaling type 'yarn'"):
        ModelConfig.from_hf(types.SimpleNamespace(**BASE, rope_scaling={"rope_type": "yarn", "factor": 2.0}))
