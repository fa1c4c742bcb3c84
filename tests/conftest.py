"""Shared fixtures: paths of the golden checkpoints and a cached transformers reference."""

from __future__ import annotations

import functools

import pytest
import torch

from golden.load import checkpoint_path

QWEN3 = "qwen3-tiny"
QWEN2 = "qwen2-tiny"


@functools.cache
def hf_model(name: str, dtype: str = "float32"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        checkpoint_path(name), dtype=getattr(torch, dtype), attn_implementation="eager"
    )
    return model.eval()


def hf_greedy(name: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers `generate(do_sample=False)` with EOS disabled: the token-for-token reference."""
    model = hf_model(name)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
            do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="session")
def qwen3_path() -> str:
    return str(checkpoint_path(QWEN3))


@pytest.fixture(scope="session")
def qwen2_path() -> str:
    return str(checkpoint_path(QWEN2))
