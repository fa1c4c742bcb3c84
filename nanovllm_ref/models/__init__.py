"""Model registry keyed by the `architectures` entry of a checkpoint's config.json."""

from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from .qwen3 import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeForCausalLM

# each class is named as transformers' class of the architecture it implements
MODEL_REGISTRY: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in (
    Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM, MistralForCausalLM)}


def get_model_class(cfg: ModelConfig) -> type[nn.Module]:
    for arch in cfg.architectures:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(f"unsupported architecture {list(cfg.architectures) or '(config.json has no architectures)'}; "
                     f"supported: {sorted(MODEL_REGISTRY)}")
