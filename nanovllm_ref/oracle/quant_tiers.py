"""What correct quantized conversions measured against the float32 goldens (transformers in float32), per golden
checkpoint: ``(largest generated-step |dlogprob|, largest prompt-position |dlogprob|, the golden set's mean
generated-step |dlogprob|)``, from ``python -m tools.peer_local --engine NAME`` (its ``tiers.json``; the JSON reports
of the quantized runs). tolerances.QUANT_TIERS turns them into bounds. Checkpoints an engine fails for a traced
engine / converter bug are left out (conformance/README.md, "Peers").
"""

from __future__ import annotations

from typing import NamedTuple


class MeasuredTier(NamedTuple):
    what: str
    source: str
    checkpoints: dict[str, tuple[float, float, float]]  # name -> (gen max, prompt max, set mean)


MEASURED: dict[str, MeasuredTier] = {
    "gguf-q8_0": MeasuredTier(
        "llama.cpp GGUF q8_0 weights (convert_hf_to_gguf --outtype q8_0), f32 KV cache",
        "llama-cpp-python 0.3.36, 2026-12-01", {
            "llama3-bias-hd32": (0.3066, 0.2674, 0.0385),
            "llama3-tiny": (0.2686, 0.2823, 0.0414),
            "mistral-hd64": (0.2881, 0.3268, 0.0427),
            "mistral-spm-hd32": (0.219, 0.2326, 0.0403),
            "mistral-tiny": (0.2741, 0.3468, 0.0423),
            "qwen2-hd64": (0.4139, 0.5081, 0.0521),
            "qwen2-tiny": (0.2788, 0.3629, 0.046),
            "qwen3-gqa4": (0.2727, 0.2747, 0.0392),
            "qwen3-tied-hd64": (0.2615, 0.3256, 0.0385),
            "qwen3-tiny": (0.5189, 0.5092, 0.0571),
        }),
    "gguf-bf16": MeasuredTier(
        "llama.cpp GGUF bf16 weights (convert_hf_to_gguf --outtype bf16), f32 KV cache",
        "llama-cpp-python 0.3.36, 2026-12-01", {
            "llama3-bias-hd32": (0.0951, 0.0722, 0.0103),
            "llama3-tiny": (0.0808, 0.0807, 0.0114),
            "mistral-hd64": (0.1109, 0.0819, 0.0116),
            "mistral-spm-hd32": (0.0882, 0.0669, 0.012),
            "mistral-tiny": (0.0724, 0.109, 0.0117),
            "qwen2-hd64": (0.1384, 0.1239, 0.0143),
            "qwen2-tiny": (0.1015, 0.1, 0.0121),
            "qwen3-gqa4": (0.0873, 0.0908, 0.0116),
            "qwen3-tied-hd64": (0.0763, 0.1023, 0.011),
            "qwen3-tiny": (0.1483, 0.1589, 0.0168),
        }),
    "ct2-int8": MeasuredTier(
        "CTranslate2 int8 weights and GEMMs (compute_type int8)", "CTranslate2 4.8.5, 2026-12-01", {
            "mistral-hd64": (0.4816, 0.8041, 0.0696),
            "mistral-spm-hd32": (0.2445, 0.2446, 0.0457),
            "mistral-tiny": (0.4193, 0.3708, 0.0586),
            "qwen2-hd64": (0.9771, 0.8217, 0.0809),
            "qwen2-tiny": (0.6249, 0.5074, 0.0723),
            "qwen3-bias-hd32": (1.2332, 1.6473, 0.1312),
            "qwen3-gqa4": (0.4128, 0.3758, 0.0505),
            "qwen3-tied-hd64": (0.4275, 0.4266, 0.0543),
            "qwen3-tiny": (0.6286, 0.5243, 0.0749),
            "qwen3-words-hd32": (0.2606, 0.3525, 0.0487),
        }),
    "ort-int4": MeasuredTier(
        "ONNX Runtime GenAI int4 MatMulNBits weights (builder -p int4 -e cpu)",
        "onnxruntime-genai 0.18.0, 2026-12-01", {
            "llama3-bias-hd32": (1.4867, 1.8588, 0.2953),
            "llama3-tiny": (2.1125, 2.8353, 0.3627),
            "mistral-hd64": (1.7664, 2.6474, 0.3641),
            "mistral-spm-hd32": (2.28, 2.4009, 0.3807),
            "qwen2-hd64": (3.0523, 3.3824, 0.4372),
            "qwen2-tiny": (2.528, 2.7736, 0.3878),
            "qwen3-bias-hd32": (4.4471, 6.5727, 0.7),
            "qwen3-gqa4": (1.8705, 2.4636, 0.3164),
            "qwen3-tied-hd64": (2.6938, 3.3471, 0.3722),
            "qwen3-tiny": (3.9496, 4.488, 0.6906),
            "qwen3-words-hd32": (2.1989, 2.924, 0.4422),
        }),
}
