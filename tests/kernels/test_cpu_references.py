"""The RMSNorm and RoPE references, written for the CPU path's speed (in-place scaling, no cat of the rotated
halves, factors shared by a step's layers), against transformers' own formulas: bit for bit in float32, bfloat16
and float16, on contiguous and strided rows (the CPU path norms and rotates a view of the packed qkv rows)."""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref.kernels.rmsnorm import rms_norm_reference
from nanovllm_ref.kernels.rotary import apply_rotary_reference, rope_cos_sin_cache, rotary_tables, rotate

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def transformers_rms_norm(x, weight, eps, residual=None):  # modeling_qwen3.Qwen3RMSNorm (+ the residual add)
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(x.dtype)
    return out if residual is None else (out, residual)


def transformers_rope(x, positions, cos_sin_cache):  # modeling_qwen3.apply_rotary_pos_emb, one tensor
    cos, sin = cos_sin_cache[positions.long(), None].to(x.dtype).chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 17), (5, 96), (33, 10, 32), (513, 3, 128)])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_reference_is_transformers_bit_for_bit(dtype, shape, residual):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape[:-1], 2 * shape[-1], generator=gen) * 3).to(dtype)[..., ::2]  # strided rows
    weight = torch.randn(shape[1:], generator=gen).to(dtype)
    res = torch.randn(shape, generator=gen).to(dtype) if residual else None
    out, ref = rms_norm_reference(x, weight, 1e-6, res), transformers_rms_norm(x, weight, 1e-6, res)
    for a, b in zip(out, ref) if residual else [(out, ref)]:
        assert a.dtype == b.dtype and torch.equal(a, b)
    if dtype != torch.float32:  # a float32 weight promotes the output, as `weight * h` does
        w32 = weight.float()
        out, ref = rms_norm_reference(x, w32, 1e-6), transformers_rms_norm(x, w32, 1e-6)
        assert out.dtype == torch.float32 and torch.equal(out, ref)


def test_rms_norm_reference_leaves_its_inputs_alone():
    x, weight, res = torch.randn(4, 8), torch.randn(8), torch.randn(4, 8)
    copies = [t.clone() for t in (x, weight, res)]
    rms_norm_reference(x, weight, 1e-6)
    rms_norm_reference(x, weight, 1e-6, res)
    assert all(torch.equal(a, b) for a, b in zip((x, weight, res), copies))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [8, 32, 128])
def test_rotary_reference_is_transformers_bit_for_bit(dtype, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cache = rope_cos_sin_cache(inv_freq, 4096)
    positions = torch.randint(0, 4096, (37,), generator=gen)
    packed = torch.randn(37, 7, 2 * head_dim, generator=gen).to(dtype)
    x = packed[:, 1:6, :head_dim]  # a strided view, as the CPU path's q/k rows of the packed projection
    ref = transformers_rope(x, positions, cache)
    out = apply_rotary_reference(x, positions, cache)
    assert out.dtype == dtype and torch.equal(out, ref)
    assert torch.equal(rotate(x, *rotary_tables(positions, cache, dtype)), ref)  # the factors a CPU step shares


def test_cpu_qk_in_token_blocks_equals_one_pass(qwen3_path, monkeypatch):
    """The CPU path norms and rotates a prompt step's q/k rows a cache-sized block of tokens at a time: the blocks
    (one token each here, the last one partial for any length) must give bit for bit the one-pass result, and the
    step's RoPE factors, made by the first layer, must serve every layer."""
    import nanovllm_ref.attention.base as base
    import nanovllm_ref.kernels.qkv_epilogue as epilogue
    import nanovllm_ref.kernels.rotary as rotary
    from nanovllm_ref import LLM, SamplingParams

    llm = LLM(qwen3_path, dtype="float32", attention_backend="sdpa")
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9], [7]]

    def run():
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.token_ids, o.logprobs, o.prompt_logprobs) for o in outs]

    tables, rotations = [], []
    monkeypatch.setattr(base, "rotary_tables", lambda *a: tables.append(1) or rotary.rotary_tables(*a))
    monkeypatch.setattr(epilogue, "rotate", lambda *a, **k: rotations.append(1) or rotary.rotate(*a, **k))
    one_pass, forwards = run(), len(tables)
    layers = llm.engine.hf_config.num_hidden_layers
    assert layers > 1 and len(rotations) == forwards * layers  # one table per step, one rotation per layer
    monkeypatch.setattr(epilogue, "CPU_BLOCK_BYTES", 1)
    rotations.clear()
    llm.reset_prefix_cache()
    assert run() == one_pass
    assert len(rotations) >= layers * sum(map(len, prompts))  # the prompt step went a token at a time


def test_cpu_linear_weights_column_major_same_outputs(qwen3_path):
    """On the CPU the loader stores the linear weights column-major once loaded (a faster BLAS product on decode
    rows): same values, and the same greedy tokens as row-major weights."""
    from nanovllm_ref import LLM, SamplingParams
    from nanovllm_ref.layers.linear import LinearBase

    llm = LLM(qwen3_path, dtype="float32", attention_backend="sdpa")
    model = llm.engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    before = [m.weight.detach().clone() for m in linears]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8]]
    col = llm.generate(prompts, params, use_tqdm=False)
    assert all(m.weight.t().is_contiguous() and not m.weight.is_contiguous() for m in linears)
    assert all(torch.equal(m.weight, w) for m, w in zip(linears, before))
    for m in linears:  # back to row-major (the model keeps it: it lays out once)
        m.weight.data = m.weight.data.contiguous()
    llm.reset_prefix_cache()
    row = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in col] == [o.token_ids for o in row]
    for a, b in zip(col, row):
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < 1e-4 for t in x)
