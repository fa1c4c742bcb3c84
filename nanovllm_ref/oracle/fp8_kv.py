"""The reference of the "fp8-kv" conformance tier: transformers with K and V quantized to FP8 (e4m3) and
dequantized at the points an engine's KV cache does it, with per-(layer, KV head) scales the checkpoint carries.

The quantization points: the keys after q/k norm and RoPE and the values after their projection, i.e. what an
engine stores in its cache, as transformers hands them to the attention function. An attention function
registered with transformers (``AttentionInterface``) replaces every K and V element x that attention sees
(this step's tokens included) by ``fp8_e4m3(clamp(x / s, -448, 448)) * s`` in float32, cast back to the model
dtype, then calls the model's own eager (or sdpa) attention. transformers' cache keeps the unquantized values
and the function quantizes them again at each step: the same values, since quantization is deterministic.
This file is the oracle's own statement of the rule; nothing here calls the engine's kernels.

Scales (``calibrate``): amax / 448 per (layer, K or V, KV head) over the golden prompts, measured with the
model-dtype reference: the largest stored value maps to e4m3's largest, the rest keep 3 mantissa bits; heads and
layers get different scales, so a scale on the wrong head or applied twice costs real accuracy (with vLLM's
default of 1.0 everywhere such bugs are invisible). They are written next to the weights as
``model.layers.{i}.self_attn.k_scale`` / ``v_scale`` (vLLM's names, one value per KV head) in a derived
checkpoint (``scaled_checkpoint``), which the engine under test loads. Its config.json declares them the way
llm-compressor does (``KV_CACHE_QUANTIZATION``: compressed-tensors' ``kv_cache_scheme``, fp8 per attention head):
without a ``quantization_config`` vLLM creates no k/v_scale parameters and refuses the checkpoint ("There is no
module or parameter named 'layers.0.self_attn.k_scale'", vLLM 0.32 model_executor/layers/attention/attention.py
``_init_kv_cache_quant``). nanovllm_ref reads the scales by name; the reference here loads the weights without the
declaration (``HFAdapter(quantization=False)``), which transformers would otherwise hand to compressed-tensors.

Noise (``reference``): the same prompts through sdpa attention with every K and V element nudged up before
quantizing (``NUDGE``: at least the size of two correct engines' differences), so that the measured noise includes
the e4m3 rounding flips such engines produce (a flip costs far more than the attention arithmetic).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from .compare import compare_all
from .derived import link_checkpoint
from .references import Reference

E4M3_MAX = 448.0
# relative K/V nudge of the noise run. bf16/fp16: one ulp (two engines' bf16 keys often differ by one). float32:
# 2^-16, which flips about one stored e4m3 value in 4,000 (2^-16 / e4m3's relative step 2^-4), more than two
# float32 engines do (their ~1e-6 differences flip about one in 60,000): on the tier's 12 prompts of qwen3-tiny one
# ulp and 2^-20 flipped none (noise 8.6e-6) while nanovllm_ref's run had a flip costing 3e-3; 2^-16 gives max
# 0.126 / mean 1.6e-3, so the noise samples several flips per run. A flip's cost is local: the mean over the set
# (mean_tol) stays tight (nanovllm_ref 6e-6; scales of 1.0: 0.17; no fp8 at all: 0.13)
NUDGE = {torch.bfloat16: 2**-8, torch.float16: 2**-11, torch.float32: 2**-16}
NAMES = ("k_scale", "v_scale")
# config.json's quantization_config of a scaled checkpoint: KV cache only (no weight scheme), fp8 e4m3, symmetric,
# static, one scale per (layer, KV head): llm-compressor's layout, which vLLM loads (compressed-tensors'
# CompressedTensorsKVCacheMethod: per-head scales with strategy "attn_head")
KV_CACHE_QUANTIZATION = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "ignore": [],
                         "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "attn_head",
                                             "symmetric": True, "dynamic": False}}
_RECORD: dict[int, torch.Tensor] = {}  # calibration: layer -> (2, kv_heads) running amax


def fake_quant(x: torch.Tensor, scale: torch.Tensor, nudge: bool = False) -> torch.Tensor:
    """x (batch, kv_heads, seq, head_dim) in the model dtype -> its e4m3 value with per-head scale (kv_heads,)."""
    s = scale.to(x.device).view(1, -1, 1, 1)
    y = x.float()
    if nudge:  # up by the size of two correct engines' K/V differences in this dtype (module docstring)
        y = y * (1 + NUDGE[x.dtype])
    q = (y / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * s).to(x.dtype)


def _attention(base: str, nudge: bool = False):
    def attend(module: Any, query, key, value, attention_mask, **kwargs):
        scales = getattr(module, "fp8_kv_scales", None)
        if scales is None:  # calibration: record the amax per KV head, attend unquantized
            amax = torch.stack([key.detach().abs().amax(dim=(0, 2, 3)), value.detach().abs().amax(dim=(0, 2, 3))])
            prev = _RECORD.get(module.layer_idx)
            _RECORD[module.layer_idx] = amax.float() if prev is None else torch.maximum(prev, amax.float())
        else:
            key, value = fake_quant(key, scales[0], nudge), fake_quant(value, scales[1], nudge)
        if base == "eager":
            fn = sys.modules[type(module).__module__].eager_attention_forward
        else:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward as fn
        return fn(module, query, key, value, attention_mask, **kwargs)

    return attend


def register() -> None:
    """The attention functions ``fp8kv-eager``, ``fp8kv-sdpa-nudged`` and ``fp8kv-calibrate`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    for name, base, nudge in (("fp8kv-eager", "eager", False), ("fp8kv-sdpa-nudged", "sdpa", True),
                              ("fp8kv-calibrate", "eager", False)):
        AttentionInterface.register(name, _attention(base, nudge))
        # without a mask function of the same name transformers builds no causal mask at all
        AttentionMaskInterface.register(name, eager_mask if base == "eager" else sdpa_mask)


def _layers(model: Any) -> list[Any]:
    return [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "k_proj")]


def read_scales(path: str) -> dict[int, torch.Tensor] | None:
    """The checkpoint's (2, kv_heads) scales per layer from ``kv_scales.safetensors``, or None."""
    file = Path(path) / "kv_scales.safetensors"
    if not file.exists():
        return None
    from safetensors.torch import load_file

    t = load_file(str(file))
    layers = sorted({int(n.split(".")[2]) for n in t})
    return {i: torch.stack([t[f"model.layers.{i}.self_attn.{n}"].float() for n in NAMES]) for i in layers}


def calibrate(model_path: str, dtype: str, prompts: list[list[int]]) -> dict[int, torch.Tensor]:
    """amax / 448 per (layer, K or V, KV head) over the prompts' positions, in the model dtype reference."""
    from .adapters import HFAdapter

    register()
    _RECORD.clear()
    hf = HFAdapter(model_path, dtype, attn_implementation="fp8kv-calibrate")
    try:
        with torch.inference_mode():
            for p in prompts:
                hf.model(input_ids=torch.tensor([p]), use_cache=False)
    finally:
        hf.close()
    return {i: (a / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny) for i, a in sorted(_RECORD.items())}


def scaled_checkpoint(model_path: str, out_dir: str, scales: dict[int, torch.Tensor]) -> str:
    """A checkpoint folder: ``model_path``'s files (symlinked) plus ``kv_scales.safetensors`` with ``scales``, and
    config.json with ``KV_CACHE_QUANTIZATION`` as its ``quantization_config`` (module docstring)."""
    from safetensors.torch import save_file

    config = json.loads((Path(model_path) / "config.json").read_text())
    if config.get("quantization_config") is not None:
        raise ValueError(f"{model_path!r} already declares a quantization_config: the fp8-kv tier needs an unquantized "
                         "checkpoint (its scales are declared as a KV-cache-only compressed-tensors scheme)")
    out = link_checkpoint(model_path, out_dir, replaced=("config.json",))
    if (out / "config.json").is_symlink():  # a folder made before the declaration existed
        (out / "config.json").unlink()
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": KV_CACHE_QUANTIZATION}, indent=2)
                                     + "\n")
    tensors = {f"model.layers.{i}.self_attn.{n}": s[j].contiguous() for i, s in scales.items()
               for j, n in enumerate(NAMES)}
    save_file(tensors, str(out / "kv_scales.safetensors"))
    (out / "kv_scales.json").write_text(json.dumps(
        {"rule": "amax / 448 per (layer, K or V, KV head) over the golden prompts (nanovllm_ref.oracle.fp8_kv)",
         "scales": {str(i): s.tolist() for i, s in scales.items()}}, indent=1) + "\n")
    return str(out)


def _run(model_path: str, dtype: str, attn: str, prompts: list[list[int]], max_tokens: int, top_k: int):
    """transformers with the fp8 attention ``attn``, the layers' scales read from the checkpoint."""
    from .adapters import HFAdapter

    register()
    scales = read_scales(model_path)
    if scales is None:
        raise ValueError(f"{model_path!r} carries no kv_scales.safetensors (see scaled_checkpoint)")
    hf = HFAdapter(model_path, dtype, attn_implementation=attn, quantization=False)
    try:
        for layer in _layers(hf.model):
            layer.fp8_kv_scales = scales[layer.layer_idx]
        return hf.generate(prompts, max_tokens, top_k, prompt_logprobs=True)
    finally:
        hf.close()


def reference(model: str, model_path: str, dtype: str, prompts: list[list[int]], prompt_ids: list[str],
              max_tokens: int = 32, top_k: int = 20) -> Reference:
    """The fp8-kv reference of a scaled checkpoint, with its noise in ``meta["noise"]`` (module docstring): the
    largest |dlogprob| of the generated steps and prompt positions, and the mean over the generated steps."""
    outputs = _run(model_path, dtype, "fp8kv-eager", prompts, max_tokens, top_k)
    alt = _run(model_path, dtype, "fp8kv-sdpa-nudged", prompts, max_tokens, top_k)
    rep = compare_all(outputs, alt, top_k=top_k, tol=float("inf"), prompt_tol=float("inf"))
    count = sum(p.gen_diff_count for p in rep.prompts)
    ref = Reference(model, model_path, dtype, [list(p) for p in prompts], list(prompt_ids), outputs, max_tokens,
                    top_k, source="fp8-kv")
    ref.meta["noise"] = {"generated": max(p.max_gen_diff for p in rep.prompts),
                         "prompt": max(p.max_prompt_diff for p in rep.prompts),
                         "mean": sum(p.gen_diff_sum for p in rep.prompts) / max(count, 1),
                         "method": "fp8-kv eager vs sdpa with K/V nudged up (NUDGE) before quantizing"}
    return ref


def tolerance(ref: Reference, options_tol: float | None = None, options_prompt_tol: float | None = None):
    """max(3 x the reference's noise, the dtype's floor) per position, and 3 x its mean noise for the set's mean."""
    from .tolerances import noise_tolerance

    n = ref.meta["noise"]
    return noise_tolerance(ref.dtype, n["generated"], n["prompt"], n["method"], mean=n["mean"]).override(
        options_tol, options_prompt_tol)


def drift(model_dtype_ref: Reference, fp8_ref: Reference) -> dict[str, Any]:
    """What FP8 KV costs on this model: the fp8-kv reference against the model-dtype-KV one (the goldens)."""
    rep = compare_all(model_dtype_ref.outputs, fp8_ref.outputs, top_k=fp8_ref.top_k, tol=float("inf"),
                      prompt_tol=float("inf"))
    return {"max_gen_diff": max(p.max_gen_diff for p in rep.prompts),
            "max_prompt_diff": max(p.max_prompt_diff for p in rep.prompts),
            "prompts_diverged": sum(p.first_divergence is not None for p in rep.prompts),
            "prompts": len(rep.prompts)}
