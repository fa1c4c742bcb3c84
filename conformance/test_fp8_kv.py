"""The "fp8-kv" tier: an engine's FP8 (e4m3) KV cache against transformers with K and V quantized and dequantized
at the same points, with the same per-(layer, KV head) scales (nanovllm_ref.oracle.fp8_kv, which documents the
rule, the calibration and the noise measurement).

Per checkpoint: scales calibrated (amax / 448) on the golden prompts and written beside the weights in a derived
checkpoint, which the engine loads; a subset of the golden prompts (the block edges and the shared prefixes)
compared cold (prompt logprobs too) and again warm (the prefix cache serves the prompts: a prefix-cache hit must
read the blocks as they were stored); tolerance = max(3 x the reference's own noise, the dtype's floor). Each
report also records the drift of the fp8-kv reference from the model-dtype KV goldens (what FP8 KV costs on that
model), shown in the summary and the JSON report.

Another engine runs it with its FP8 KV setting and a reader of the scales, e.g.
``pytest --pyargs conformance -k fp8_kv --engine vllm --engine-arg kv_cache_dtype=fp8``: the checkpoint's config.json
declares the scales as compressed-tensors' per-head KV cache scheme, which vLLM needs to load them (vLLM 0.32's CPU
build fails the tier for reasons of its own: conformance/README.md, "FP8 KV cache").
"""

from __future__ import annotations

import pytest

from nanovllm_ref.oracle import fp8_kv
from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.references import golden_reference, run_check

from .harness import ModelSpec, live_prompts

PROMPTS = ("single_a", "short_5", "block_15", "block_16", "block_17", "block_33", "long_130", "shared48_prefix",
           "shared48_a", "shared48_b", "prefix_of_next", "extends_prev")
_CACHE: dict[tuple, tuple] = {}


def _prompts(model_spec: ModelSpec) -> tuple[list[list[int]], list[str]]:
    if model_spec.golden:
        g = golden_reference(model_spec.name, "float32")
        idx = [g.prompt_ids.index(p) for p in PROMPTS]
        return [g.prompts[i] for i in idx], list(PROMPTS)
    prompts, names = live_prompts(model_spec.path)
    return prompts[: len(PROMPTS)], names[: len(PROMPTS)]


def tier_reference(model_spec: ModelSpec, dtype: str, tmp_root) -> tuple[ModelSpec, object, dict | None]:
    """(the scaled checkpoint, its fp8-kv reference, the drift from the goldens), made once per session."""
    key = (model_spec.path, dtype)
    if key not in _CACHE:
        prompts, names = _prompts(model_spec)
        ck = _CACHE.get((model_spec.path, "checkpoint"))
        if ck is None:
            scales = fp8_kv.calibrate(model_spec.path, "float32", prompts)
            ck = _CACHE[(model_spec.path, "checkpoint")] = fp8_kv.scaled_checkpoint(
                model_spec.path, str(tmp_root / model_spec.name), scales)
        ref = fp8_kv.reference(model_spec.name, ck, dtype, prompts, names)
        drift = None
        if model_spec.golden:
            g = golden_reference(model_spec.name, dtype)
            drift = fp8_kv.drift(g.subset([g.prompt_ids.index(p) for p in names]), ref)
        _CACHE[key] = (ModelSpec(model_spec.name, ck, False), ref, drift)
    return _CACHE[key]


@pytest.fixture(scope="session")
def tier_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fp8-kv")


def _fp8_setting(options) -> dict:
    if dict(options.engine_args).get("kv_cache_dtype") is not None:
        return {}
    if options.engine == "nanovllm_ref":
        return {"kv_cache_dtype": "fp8_e4m3"}
    pytest.skip("the fp8-kv tier needs the engine's FP8 KV setting, e.g. --engine-arg kv_cache_dtype=fp8")


@pytest.mark.parametrize("d,q_dtype", [(32, "float32"), (128, "bfloat16")])
def test_fp8_kv_kernels(options, d, q_dtype) -> None:
    """nanovllm_ref's Triton KV store and decode kernels (the interpreter off-GPU) on an fp8 cache against the
    oracle's rule: stored values equal fake_quant's (values past +-448 x scale saturate), attention over them
    equals float32 attention over fake_quant's K/V (per-head scales differing between K and V). head_dim 128 with
    bf16 queries is the case that a CUDA sm_90 GPU sends to the Gluon decode kernel (kernels/decode_attention_fp8.py);
    its bound is bf16's output rounding."""
    if options.engine != "nanovllm_ref":
        pytest.skip("checks nanovllm_ref's own kernels")
    from nanovllm_ref.testing.mismatch import triton_unavailable

    if (why := triton_unavailable()) is not None:
        pytest.skip(f"kernel candidate store_kv / decode_attention [triton, fp8 cache]: {why}")
    import torch

    from nanovllm_ref.kernels.decode_attention import decode_attention
    from nanovllm_ref.kernels.store_kv import store_kv

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    ctx, heads, kv_heads, bs = [37, 70], 4, 2, 16
    blocks = [-(-c // bs) for c in ctx]  # sequence 0 in cache blocks 0..2, sequence 1 in 3..7
    k, v = (torch.randn(sum(ctx), kv_heads, d, generator=gen) * 3 for _ in range(2))
    scales = torch.tensor([[0.004, 0.009], [0.002, 0.02]])  # 3 x 0.004 x 448 = 5.4: some K values saturate
    slots = torch.cat([torch.arange(ctx[0]), blocks[0] * bs + torch.arange(ctx[1])])
    caches = [torch.zeros(sum(blocks), bs, kv_heads, d).to(torch.float8_e4m3fn).to(device) for _ in range(2)]
    store_kv(k.to(device), v.to(device), *caches, slots.to(device), scales.to(device))
    kq, vq = (fp8_kv.fake_quant(x.transpose(0, 1)[None], scales[i])[0].transpose(0, 1) for i, x in enumerate((k, v)))
    for i, want in enumerate((kq, vq)):
        got = caches[i].view(-1, kv_heads, d)[slots.to(device)].float().cpu() * scales[i][:, None]
        assert torch.equal(got, want), "stored fp8 values differ from the rule"
    q = torch.randn(len(ctx), heads, d, generator=gen)
    # kv head 1: every score negative (keys >= 0, its queries <= 0), so a zero-filled key past the end that a wrong
    # mask lets in (score 0) would take most of the weight; with signed scores it hides below bf16's rounding
    k[:, 1], q[:, 2:] = k[:, 1].abs(), -q[:, 2:].abs() * 0.3
    q = q.to(getattr(torch, q_dtype))
    tables = torch.tensor([[0, 1, 2, 0, 0], [3, 4, 5, 6, 7]], dtype=torch.int32)
    out = decode_attention(q.to(device), *caches, tables.to(device), torch.tensor(ctx, dtype=torch.int32).to(device),
                           d**-0.5, kv_scales=scales.to(device)).float().cpu()
    bound = 1e-4 if q_dtype == "float32" else 2**-7  # bf16 rounds the output to 8 bits
    for s, (start, c) in enumerate(zip([0, ctx[0]], ctx)):
        kk = kq[start: start + c].repeat_interleave(heads // kv_heads, 1)  # (c, heads, d)
        vv = vq[start: start + c].repeat_interleave(heads // kv_heads, 1)
        p = torch.einsum("hd,khd->hk", q[s].float(), kk).mul(d**-0.5).softmax(-1)
        want = torch.einsum("hk,khd->hd", p, vv)
        err = ((out[s] - want).abs().max() / (want.abs().max() if q_dtype != "float32" else 1.0)).item()
        assert err < bound, f"decode over the fp8 cache, sequence {s}: error {err:.2e}"
    _check_fp8_prefill(q_dtype, device, caches, tables, ctx, scales, kq, vq, heads, bound)


def _check_fp8_prefill(q_dtype: str, device: str, caches, tables, ctx, scales, kq, vq, heads: int, bound: float):
    """The Triton prefill kernel over the same fp8 cache: the last CHUNK tokens of each sequence as queries after
    their cached prefix (a prefix-cache hit, a chunked prefill), causal, against float32 attention over
    fake_quant's K/V (the V scale differs from the K scale on every head)."""
    import torch

    from nanovllm_ref.kernels.prefill_attention import prefill_attention

    chunk, d = 5, kq.shape[-1]
    q = torch.randn(chunk * len(ctx), heads, d, generator=torch.Generator().manual_seed(1)).to(getattr(torch, q_dtype))
    starts = torch.arange(len(ctx) + 1, dtype=torch.int32) * chunk
    out = prefill_attention(q.to(device), *caches, starts.to(device), torch.tensor(ctx, dtype=torch.int32).to(device),
                            tables.to(device), d**-0.5, kv_scales=scales.to(device)).float().cpu()
    group = heads // kq.shape[1]
    for s, (begin, c) in enumerate(zip([0, ctx[0]], ctx)):
        kk, vv = (x[begin: begin + c].repeat_interleave(group, 1) for x in (kq, vq))  # (c, heads, d)
        scores = torch.einsum("qhd,khd->hqk", q[s * chunk:(s + 1) * chunk].float(), kk) * d**-0.5
        causal = torch.arange(c)[None, :] <= torch.arange(c - chunk, c)[:, None]  # (chunk, c)
        want = torch.einsum("hqk,khd->qhd", scores.masked_fill(~causal, float("-inf")).softmax(-1), vv)
        got = out[s * chunk:(s + 1) * chunk]
        err = ((got - want).abs().max() / (want.abs().max() if q_dtype != "float32" else 1.0)).item()
        assert err < bound, f"prefill over the fp8 cache, sequence {s}: error {err:.2e}"


def test_fp8_kv(model_spec, dtype, options, engines, record, tier_root) -> None:
    extra = _fp8_setting(options)
    spec, ref, drift = tier_reference(model_spec, dtype, tier_root)
    tol = fp8_kv.tolerance(ref, options.tol, options.prompt_tol)
    outputs = engines.generate(spec, dtype, ref, **extra)
    adapter = engines.get(spec, dtype, **extra)
    cold = run_check(adapter, ref, tol, case="fp8-kv", outputs=outputs)
    cold.meta["fp8_kv_drift_vs_model_dtype_kv"] = drift
    record(cold)
    warm = run_check(adapter, ref, tol, case="fp8-kv-warm", prompt_logprobs=False)  # prefix-cache hits
    record(warm)
    assert cold.passed, f"drift of the reference vs model-dtype KV: {drift}\n" + cold.format_failures()
    assert warm.passed, "\n" + warm.format_failures()


@pytest.mark.gpu
def test_fp8_kv_gpu(model_spec, options, record, tier_root) -> None:
    """nanovllm_ref on CUDA (Triton kernels, CUDA graphs) in bfloat16 with an FP8 cache."""
    if options.engine != "nanovllm_ref":
        pytest.skip("the GPU variant drives nanovllm_ref; other engines pick their device themselves")
    spec, ref, _ = tier_reference(model_spec, "bfloat16", tier_root)
    kwargs = {**dict(options.engine_args), **({"tensor_parallel_size": options.tp} if options.tp > 1 else {})}
    kwargs.setdefault("kv_cache_dtype", "fp8_e4m3")
    adapter = NanovllmRefAdapter(spec.path, "bfloat16", device="cuda", **kwargs)
    try:
        tol = fp8_kv.tolerance(ref, options.tol, options.prompt_tol)
        cold = run_check(adapter, ref, tol, case="fp8-kv-cuda")
        warm = run_check(adapter, ref, tol, case="fp8-kv-cuda-warm", prompt_logprobs=False)
    finally:
        adapter.close()
    record(cold)
    record(warm)
    assert cold.passed, "\n" + cold.format_failures()
    assert warm.passed, "\n" + warm.format_failures()

