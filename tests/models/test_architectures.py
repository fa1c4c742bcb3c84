"""Llama (with Llama 3 RoPE scaling, biases), Mistral and Qwen3-MoE against transformers on tiny random checkpoints
made here (the golden set covers Qwen3/Qwen2; these prove the other registered architectures token for token), and
refusals of configs the engine would otherwise compute wrongly."""

from __future__ import annotations

import json
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
    "qwen3-moe": ("Qwen3MoeForCausalLM", dict(  # layer 1 dense through mlp_only_layers
        num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        mlp_only_layers=[1], decoder_sparse_step=1)),
    "qwen3-moe-unnormalized": ("Qwen3MoeForCausalLM", dict(  # layers 1 and 3 sparse through decoder_sparse_step
        num_hidden_layers=4, num_experts=6, num_experts_per_tok=4, moe_intermediate_size=24, norm_topk_prob=False,
        mlp_only_layers=[], decoder_sparse_step=2, tie_word_embeddings=True)),
}
MOE = CASES["qwen3-moe"]


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


def _edit_config(path: str, **changes) -> None:
    with open(f"{path}/config.json") as f:
        cfg = json.load(f)
    with open(f"{path}/config.json", "w") as f:
        json.dump({**cfg, **changes}, f)


@pytest.mark.parametrize("field,value", [
    ("shared_expert_intermediate_size", 64),  # Qwen2-MoE-style shared expert: silently ignoring it would be wrong
    ("rope_parameters", dict(rope_type="yarn", factor=4.0, rope_theta=10000.0, original_max_position_embeddings=128)),
])
def test_qwen3_moe_unsupported_config_is_refused(tmp_path, field, value):
    path = _make(tmp_path, MOE[0], **MOE[1])
    _edit_config(path, **{field: value})
    with pytest.raises(ValueError, match="shared_expert_intermediate_size=64" if "shared" in field else "rope_scaling"):
        LLM(path, dtype="float32")


def test_qwen3_moe_loads_fused_expert_tensors(tmp_path):
    """A checkpoint with transformers' in-memory fused expert tensors (experts.gate_up_proj (E, 2I, H),
    experts.down_proj (E, H, I)) loads to the same model as the per-expert tensors save_pretrained writes."""
    from safetensors.torch import load_file, save_file

    path = _make(tmp_path, MOE[0], **MOE[1])
    tensors, fused = load_file(f"{path}/model.safetensors"), {}
    for name in list(tensors):
        if ".experts." in name:
            prefix, rest = name.split(".experts.")
            expert, proj = int(rest.split(".")[0]), rest.split(".")[1]
            fused.setdefault(prefix, {}).setdefault(proj, {})[expert] = tensors.pop(name)
    for prefix, projs in fused.items():
        stack = {p: torch.stack([projs[p][e] for e in sorted(projs[p])]) for p in projs}
        tensors[f"{prefix}.experts.gate_up_proj"] = torch.cat([stack["gate_proj"], stack["up_proj"]], dim=1)
        tensors[f"{prefix}.experts.down_proj"] = stack["down_proj"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = LLM(path, dtype="float32").generate([[5, 6, 7], [9] * 30], params, use_tqdm=False)
    save_file(tensors, f"{path}/model.safetensors")
    got = LLM(path, dtype="float32").generate([[5, 6, 7], [9] * 30], params, use_tqdm=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
