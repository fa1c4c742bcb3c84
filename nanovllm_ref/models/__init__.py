"""Model registry keyed by the `architectures` entry of a checkpoint's config.json."""

from __future__ import annotations

from typing import Any

from torch import nn

from .llama import LlamaForCausalLM, MistralForCausalLM
from .qwen2 import Qwen2ForCausalLM
from .qwen3 import Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": MistralForCausalLM,
}


def check_sliding_window(hf_config: Any, max_model_len: int) -> None:
    """Sliding-window attention is not implemented: refuse any run where the window would matter."""
    window = getattr(hf_config, "sliding_window", None)
    in_use = getattr(hf_config, "use_sliding_window", True)  # Qwen2 has the flag; Mistral uses it when set
    if window and in_use and max_model_len > window:
        raise ValueError(f"config sliding_window={window} < max_model_len={max_model_len}: sliding-window attention "
                         f"is not implemented; set max_model_len <= {window}")


def get_model_class(hf_config: Any) -> type[nn.Module]:
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(f"unsupported architecture {archs or '(config.json has no architectures)'}; "
                     f"supported: {sorted(MODEL_REGISTRY)}")
