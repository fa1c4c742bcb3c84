"""Llama (with Llama 3 RoPE scaling, biases) and Mistral against transformers on tiny random checkpoints made
here (the golden set covers Qwen3/Qwen2; these prove the other registered architectures token for token)."""

from __future__ import annotations

import random

import pytest
import torch

from nanovllm_ref import LLM, SamplingParams


def _make(tmp_path, arch: str, **overrides) -> str:
    import transformers

    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    model_cls = getattr(transformers, arch)
    base = dict(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.25, tie_word_embeddings=False,
        eos_token_id=1, bos_token_id=1, pad_token_id=0,
    )
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**base, **overrides}))
    path = str(tmp_path / arch)
    model.save_pretrained(path)
    return path


CASES = {
    "llama": ("LlamaForCausalLM", {}),
    "llama-bias": ("LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    "llama3-rope": ("LlamaForCausalLM", dict(rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64), rope_theta=500000.0)),
    "llama-linear-rope": ("LlamaForCausalLM", dict(rope_scaling=dict(rope_type="linear", factor=2.0))),
    "mistral": ("MistralForCausalLM", dict(sliding_window=None)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_matches_transformers(tmp_path, case):
    from transformers import AutoModelForCausalLM

    arch, overrides = CASES[case]
    path = _make(tmp_path, arch, **overrides)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    rng = random.Random(1)
    prompts = [[rng.randrange(2, 300) for _ in range(n)] for n in (1, 7, 17, 40, 100)]
    expected = []
    with torch.inference_mode():
        for p in prompts:
            out = hf.generate(torch.tensor([p]), max_new_tokens=10, min_new_tokens=10, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
            expected.append(out[0, len(p):].tolist())
    llm = LLM(path, dtype="float32", max_num_batched_tokens=40)  # chunked prefill too
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == expected


def test_mistral_sliding_window_beyond_max_model_len_is_refused(tmp_path):
    path = _make(tmp_path, "MistralForCausalLM", sliding_window=64)
    with pytest.raises(ValueError, match="sliding_window=64 < max_model_len=512"):
        LLM(path, dtype="float32")
    llm = LLM(path, dtype="float32", max_model_len=64)  # within the window: exact full attention
    assert len(llm.generate([[5, 6]], SamplingParams(max_tokens=3), use_tqdm=False)[0].token_ids) == 3
