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
``pytest --pyargs conformance -k fp8_kv --engine vllm --engine-arg kv_cache_dtype=fp8``.
"""

from __future__ import annotations

import pytest

from nanovllm_ref.oracle import fp8_kv
from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.references import golden_reference, run_check

from .harness import ModelSpec, live_prompts, tolerance_for

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


def test_fp8_kv(model_spec, dtype, options, engines, record, tier_root) -> None:
    extra = _fp8_setting(options)
    spec, ref, drift = tier_reference(model_spec, dtype, tier_root)
    tol = tolerance_for(dtype, options, ref)
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
        cold = run_check(adapter, ref, tolerance_for("bfloat16", options, ref), case="fp8-kv-cuda")
        warm = run_check(adapter, ref, tolerance_for("bfloat16", options, ref), case="fp8-kv-cuda-warm",
                         prompt_logprobs=False)
    finally:
        adapter.close()
    record(cold)
    record(warm)
    assert cold.passed, "\n" + cold.format_failures()
    assert warm.passed, "\n" + warm.format_failures()
