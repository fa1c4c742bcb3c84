"""Model architectures for random-weight benchmarks: Hugging Face config.json folders and their shapes.

`model_folder(arch)` writes a folder holding only a config.json (in a temp dir, once per process), which
`LLM(folder, load_format="dummy")` and transformers' `from_config` both accept; `--model PATH` (a real
checkpoint) overrides it. `ModelShape` gives the counts the roofline needs: parameters, weight bytes,
KV-cache bytes per token and FLOPs per token.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "initializer_range": 0.02,
}

# Shapes of the published Qwen3 checkpoints (their config.json), plus a tiny one for CPU smoke runs, and draft
# models for speculative decoding's benchmarks (a target's shape cut to a few layers: another model, same vocabulary).
ARCHS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False,
    },
    # CPU smoke: vocab > 10000 so the headline workload's token ids (randint(0, 10000)) are valid.
    "tiny": {
        "vocab_size": 10240, "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True,
        "max_position_embeddings": 4096, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32",
    },
}
# (an untied LM head of its own: a random tied model's argmax tends to repeat its input, and so would the target's)
ARCHS["qwen3-0.6b-draft"] = {**ARCHS["qwen3-0.6b"], "num_hidden_layers": 2, "tie_word_embeddings": False}
ARCHS["tiny-draft"] = {**ARCHS["tiny"], "num_hidden_layers": 1, "tie_word_embeddings": False}

_FOLDERS: dict[str, str] = {}


def arch_config(arch: str) -> dict[str, Any]:
    """The full config.json contents of a named architecture."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {sorted(ARCHS)}")
    return {**_COMMON, **ARCHS[arch]}


def write_config(arch: str, folder: str) -> str:
    """Write `folder/config.json` for `arch`; returns the folder."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(arch_config(arch), f, indent=2)
    return folder


def model_folder(arch: str, model: str | None = None) -> str:
    """A real checkpoint folder if `model` is given, else a temp folder with `arch`'s config.json (cached)."""
    if model:
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise ValueError(f"--model {model!r} is not a folder with a config.json")
        return model
    if arch not in _FOLDERS:
        _FOLDERS[arch] = write_config(arch, tempfile.mkdtemp(prefix=f"nanovllm_ref_perf_{arch}_"))
    return _FOLDERS[arch]


def load_format(model: str | None) -> str:
    """"auto" (read the safetensors) for a real checkpoint, "dummy" (random weights) for an arch folder."""
    return "auto" if model else "dummy"


def read_config(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"], num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"], head_dim=head_dim,
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_arch(cls, arch: str) -> ModelShape:
        return cls.from_config(arch_config(arch))

    @property
    def layer_linear_params(self) -> int:
        """Weights of one decoder layer's matmuls: q, k, v, o and the gated MLP."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size

    @property
    def num_params(self) -> int:
        """All parameters (Qwen3: q/k norms per layer, two norms per layer, final norm, embeddings)."""
        layer = self.layer_linear_params + 2 * self.hidden_size + 2 * self.head_dim
        embed = self.vocab_size * self.hidden_size
        return self.num_layers * layer + embed * (1 if self.tied else 2) + self.hidden_size

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Bytes one decode step reads: every weight once (the LM head reads the whole embedding when tied)."""
        return self.num_params * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * dtype_bytes

    def linear_flops_per_token(self) -> int:
        """Matmul FLOPs of one token through the decoder layers (no LM head)."""
        return 2 * self.num_layers * self.layer_linear_params

    def lm_head_flops_per_token(self) -> int:
        return 2 * self.vocab_size * self.hidden_size

    def attention_flops(self, num_pairs: int) -> int:
        """FLOPs of QK^T and PV over `num_pairs` (query, key) pairs, all layers and heads."""
        return 4 * self.num_layers * self.num_heads * self.head_dim * num_pairs
