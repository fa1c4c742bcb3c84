"""Logprob tolerances per dtype, derived from the float noise measured when the goldens were made.

Derivation (golden/manifest.json records the noise; ``python -m golden.make`` regenerates both)::

    noise(dtype)      = max |dlogprob| over all checkpoints and both re-computations of the goldens
                        (transformers sdpa one prompt at a time; eager batched with left padding),
                        taken separately over generated steps and over prompt positions
    tol(dtype)        = max(NOISE_FACTOR * noise_generated(dtype), FLOOR[dtype])
    prompt_tol(dtype) = max(NOISE_FACTOR * noise_prompt(dtype),    FLOOR[dtype])
    mean_tol(dtype)   = max(NOISE_FACTOR * mean_noise_generated(dtype), FLOOR[dtype])

``mean_tol`` bounds the *mean* |dlogprob| over all compared generated-step logprobs of a golden set (compare_all):
the per-position bounds must admit the rare large difference after a routing near-tie (bf16 MoE noise reaches
2.1, tol 6.29), which let a systematic error through: vLLM 0.32 drops Qwen3-MoE's o_proj bias, costing up to 4.7
per position but a mean of 0.51 against a mean noise of 0.049 (mean_tol 0.147); nanovllm_ref's bf16 means equal
the noise's (conformance/README.md, "Peers").

The measured noise is what two correct implementations of the same arithmetic differ by; an engine is
allowed 3x that. The floor covers reduction-order differences that the two transformers paths happen not to
exercise (nanovllm_ref's packed varlen batches, paged KV gathers, fused qkv/gate_up matmuls) so that the
unmodified engine passes with margin; it stays far below what real bugs cost (see tests/oracle/test_sharpness.py
and conformance/README.md, which list the measured numbers).

For comparison: vLLM's ``check_logprobs_close`` checks no values at all (only that each side's token is in
the other's top-k at the first divergence); SGLang's ``check_close_model_outputs`` bounds top-k logprob
differences by ``prefill_tolerance`` / ``decode_tolerance`` = 5e-2 (bf16/fp16 on real models, HF vs SRT).

Current numbers (golden/manifest.json of 2026-11-30: qwen2-tiny, qwen3-gqa4, qwen3-tiny; CPU, torch 2.13,
transformers 5.24):

    dtype     noise gen / prompt    tol / prompt_tol          nanovllm_ref vs goldens (gen / prompt)
    float32   1.48e-5 / 1.72e-5     1e-4 / 1e-4 (the floor)   1.43e-5 / 5.96e-6   (margin 7x / 17x)
    bfloat16  0.294 / 0.267         0.882 / 0.800 (3x noise)  0.280 / 0.292       (margin 3.1x / 2.7x;
                                                              13 of 69 prompts diverge within the top-20)

Mixture-of-experts goldens (qwen3-moe-tiny) are pooled apart (see :func:`measured_noise`): float32 noise 1.4e-5
(the floor again); bfloat16 1.44 / 2.68, tol 4.3 / 8.0; nanovllm_ref vs goldens in bf16: 2.01 at worst (a routing
flip after a near-tie), all prompts within policy. The dense numbers above are unchanged by it.

Float32 RoPE angles (``position_tol``): both re-computations above share one cos/sin table, so their noise never
shows that every float32 engine rounds the rotary angles, by more at later positions (~1e-5 rad at position 300).
On the checkpoints rescaled after training that alone exceeds the floor late in the long prompt: llama.cpp, whose
ggml rope rounds the angles differently, reached 1.29e-4 on qwen2-hd64 at prompt position 284 while matching
transformers that computes its angles to 2.4e-5 (conformance/README.md, "Peers"). So in float32 a golden
checkpoint's bound at a position is also at least NOISE_FACTOR x its RoPE spread in that position's bucket
(rope_spread.py: transformers vs the same with exact angles, measured; each bucket at least the buckets before it):
qwen2-hd64 1e-4 below position 128, 1.93e-4 from 128 to 511. Beyond 511 and on other models: the bounds above.

In float32, 3x noise alone (4.4e-5) would leave nanovllm_ref (3.2e-5 seen on a random 3-layer model) too little
margin, hence the floor; the smallest injected bug (RMSNorm eps 1e-5 for 1e-6) still costs 9.7e-3, 97x it.

With a live reference (transformers run now on another checkpoint) the same formula is applied to noise measured
on that model (eager vs sdpa): see :func:`noise_tolerance` and ``references.live_reference``.

Invariance checks (engine vs itself under another batch / cache / chunking / block size / TP layout) use
:func:`invariance_tolerance`: float32 only, tokens exact, and a fixed tight bound.

Engines running quantized weights (GGUF q8_0 / bf16, CTranslate2 int8, ONNX Runtime GenAI int4) are compared with
the float32 goldens under :func:`quantized_tolerance`: QUANT_FACTOR x what a correct conversion measured on that
checkpoint (quant_tiers.py), with ``divergence_by_value`` (compare.py); conformance/README.md, "Tolerance tiers".
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

NOISE_FACTOR = 3.0
FLOOR = {"float32": 1e-4, "bfloat16": 5e-2}
INVARIANCE_TOL = 1e-4  # float32, engine vs engine: 5.8x the largest difference seen (1.7e-5, TP=2)
DEFAULT_MANIFEST = Path(__file__).resolve().parents[2] / "golden" / "manifest.json"


@dataclass(frozen=True)
class Tolerance:
    """Bounds on |logprob difference| for generated steps (``tol``) and prompt positions (``prompt_tol``)."""

    dtype: str
    tol: float
    prompt_tol: float
    noise_generated: float | None = None  # the measured noise it was derived from
    noise_prompt: float | None = None
    derivation: str = ""
    mean_tol: float | None = None  # bound on the mean |dlogprob| of a whole golden set; None: not checked
    divergence_by_value: bool = False  # quantization tiers: a divergence may leave the top-k within tol (compare.py)
    position_tol: tuple[tuple[int, float], ...] = ()  # ((bucket end, lower bound on tol there), ...): compare.py

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def override(self, tol: float | None = None, prompt_tol: float | None = None) -> Tolerance:
        """A copy with user-given bounds (e.g. pytest --tol / --prompt-tol); None keeps the derived one. Given bounds
        hold at every position (no ``position_tol``)."""
        if tol is None and prompt_tol is None:
            return self
        how = f"overridden (derived: tol={self.tol:.3g}, prompt_tol={self.prompt_tol:.3g})"
        return Tolerance(self.dtype, tol if tol is not None else self.tol,
                         prompt_tol if prompt_tol is not None else self.prompt_tol, self.noise_generated,
                         self.noise_prompt, how, self.mean_tol, self.divergence_by_value)


def load_manifest(path: str | Path | None = None) -> dict[str, Any]:
    """golden/manifest.json as a dict ({} when there is none)."""
    p = Path(path) if path is not None else DEFAULT_MANIFEST
    return json.loads(p.read_text()) if p.is_file() else {}


def _is_moe(info: dict[str, Any]) -> bool:
    return "num_experts_per_tok" in info.get("config", {})


def noise_pool(name: str, info: dict[str, Any]) -> str:
    """Which checkpoints' noise bounds ``name``: a checkpoint rescaled after training (golden/make_checkpoints.py:
    tiny or huge hidden states, sharpened attention) only by its own, since sharp attention makes bf16 eager-vs-sdpa
    noise several times the others', and one of random weights (not trained) likewise; then mixture-of-experts
    checkpoints together, dense ones of head_dim >= 128 together (a 128-wide head sums twice the products per score:
    qwen3-hd128's bf16 noise is 0.37 against <= 0.29 for the narrower dense goldens, which it must not loosen), then
    the other dense ones."""
    train = info.get("train", {})
    if train.get("post_training") or train.get("random_init"):
        return f"own:{name}"
    if _is_moe(info):
        return "moe"
    config = info.get("config", {})
    head_dim = config.get("head_dim") or config.get("hidden_size", 0) // max(config.get("num_attention_heads", 1), 1)
    return "dense-wide-head" if head_dim >= 128 else "dense"


def measured_noise(
    manifest: dict[str, Any], dtype: str, checkpoint: str | None = None
) -> tuple[float | None, float | None]:
    """(max generated-step noise, max prompt-position noise) for ``dtype`` over methods and the checkpoints of
    ``checkpoint``'s pool (:func:`noise_pool`; dense when None or not in the manifest). A top-k routing flip turns
    bf16 noise into another expert's output (qwen3-moe-tiny: 1.4 / 2.7 vs <= 0.29 for dense models), and scores
    sharpened 3x give 0.8 (qwen3-bias-hd32), so those are pooled apart and never loosen the dense bound."""
    checkpoints = manifest.get("checkpoints", {})
    pool = noise_pool(checkpoint, checkpoints[checkpoint]) if checkpoint in checkpoints else "dense"
    gen = prompt = None
    for name, info in checkpoints.items():
        if noise_pool(name, info) != pool:
            continue
        for res in info.get("noise", {}).get(dtype, {}).values():
            g, p = res.get("generated", {}).get("max"), res.get("prompt", {}).get("max")
            if g is not None:
                gen = max(gen or 0.0, float(g))
            if p is not None:
                prompt = max(prompt or 0.0, float(p))
    if gen is None and prompt is None:  # older manifests: only the per-dtype summary
        s = manifest.get("noise_summary", {}).get(dtype, {}).get("max_abs_diff")
        gen = prompt = float(s) if s is not None else None
    return gen, prompt


def measured_mean_noise(manifest: dict[str, Any], dtype: str, checkpoint: str | None = None) -> float | None:
    """The largest *mean* generated-step noise for ``dtype`` over methods and the checkpoints of ``checkpoint``'s
    pool (as :func:`measured_noise`); None when the manifest records no means."""
    checkpoints = manifest.get("checkpoints", {})
    pool = noise_pool(checkpoint, checkpoints[checkpoint]) if checkpoint in checkpoints else "dense"
    means = [float(res["generated"]["mean"]) for name, info in checkpoints.items() if noise_pool(name, info) == pool
             for res in info.get("noise", {}).get(dtype, {}).values()
             if res.get("generated", {}).get("mean") is not None]
    return max(means) if means else None


def golden_tolerance(dtype: str, manifest: dict[str, Any] | None = None, checkpoint: str | None = None) -> Tolerance:
    """The tolerance for comparing an engine with the goldens (or a live transformers reference) in ``dtype``
    (for a golden ``checkpoint``: from the noise of its kind, see :func:`measured_noise`)."""
    if dtype not in FLOOR:
        raise ValueError(f"no tolerance policy for dtype {dtype!r}; have {sorted(FLOOR)}")
    manifest = load_manifest() if manifest is None else manifest
    gen, prompt = measured_noise(manifest, dtype, checkpoint)
    tol = noise_tolerance(dtype, gen, prompt, "golden/manifest.json", measured_mean_noise(manifest, dtype, checkpoint))
    return with_rope_spread(tol, checkpoint) if dtype == "float32" and checkpoint else tol


def with_rope_spread(tol: Tolerance, checkpoint: str) -> Tolerance:
    """``tol`` with the float32 RoPE-angle bounds of a golden checkpoint by position (module docstring): in each
    bucket NOISE_FACTOR x the measured spread, where that exceeds ``tol`` / ``prompt_tol``."""
    from dataclasses import replace

    from .rope_spread import SOURCE, envelope

    bounds = tuple((end, NOISE_FACTOR * spread) for end, spread in envelope(checkpoint))
    if not any(b > min(tol.tol, tol.prompt_tol) for _, b in bounds):
        return tol
    how = ", ".join(f"<{end}: {b:.3g}" for end, b in bounds)
    return replace(tol, position_tol=bounds, derivation=tol.derivation + f"; by position at least {NOISE_FACTOR:g} x "
                   f"the float32 RoPE-angle spread ({how}; {SOURCE})")


def noise_tolerance(dtype: str, gen: float | None, prompt: float | None, source: str = "",
                    mean: float | None = None) -> Tolerance:
    """``max(NOISE_FACTOR x noise, FLOOR[dtype])`` for generated steps and prompt positions (and, given the mean
    generated-step noise, for the mean over a golden set); used with the manifest's noise (goldens) and with noise
    measured live on another checkpoint (``--reference live``)."""
    if dtype not in FLOOR:
        raise ValueError(f"no tolerance policy for dtype {dtype!r}; have {sorted(FLOOR)}")
    floor = FLOOR[dtype]
    tol = max(NOISE_FACTOR * (gen or 0.0), floor)
    prompt_tol = max(NOISE_FACTOR * (prompt or 0.0), floor)
    how = (f"max({NOISE_FACTOR:g} x measured noise (gen {_fmt(gen)}, prompt {_fmt(prompt)}; {source}), "
           f"floor {floor:g})" if gen is not None or prompt is not None else f"floor {floor:g} (no measured noise)")
    mean_tol = None if mean is None else max(NOISE_FACTOR * mean, floor)
    if mean is not None:
        how += f"; mean_tol max({NOISE_FACTOR:g} x mean noise {_fmt(mean)}, floor {floor:g})"
    return Tolerance(dtype, tol, prompt_tol, gen, prompt, how, mean_tol)


def invariance_tolerance() -> Tolerance:
    """Engine vs itself in float32 (batching, prefix cache, preemption, chunking, block size, TP)."""
    return Tolerance("float32", INVARIANCE_TOL, INVARIANCE_TOL, derivation=f"fixed {INVARIANCE_TOL:g} (float32)")


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


# Quantization tiers: bounded logprob deltas against the float32 goldens. A bound is QUANT_FACTOR x what a correct
# conversion reached on that golden checkpoint (quant_tiers.py; measured by `python -m tools.peer_local`), or on the
# worst of the tier's checkpoints for one it was not measured on. Per checkpoint, because the quantization error of
# these tiny models differs 2-3x between checkpoints (int4 set means 0.30-0.70), so that one bound for all would let
# through a wrong rope_theta on qwen2-tiny (mean 0.88 at int4, against qwen2-tiny's own 0.39 and the worst 0.70).
QUANT_FACTOR = 2.0


def quantized_tolerance(quantization: str, dtype: str = "float32", checkpoint: str | None = None) -> Tolerance:
    """The bounds of ``quantization`` (an adapter's ``quantization``: a key of quant_tiers.MEASURED) for a golden
    ``checkpoint``; the goldens compared must be float32 (transformers in float32 is the tier's reference)."""
    from .quant_tiers import MEASURED

    if quantization not in MEASURED:
        raise ValueError(f"no tolerance tier for quantization {quantization!r}; have {sorted(MEASURED)}")
    if dtype != "float32":
        raise ValueError(f"quantization tier {quantization!r} is measured against the float32 goldens; "
                         f"--dtype is {dtype!r}")
    tier = MEASURED[quantization]
    values = tier.checkpoints.get(checkpoint or "")
    where = f"{checkpoint}'s" if values else f"the worst of {len(tier.checkpoints)} goldens'"
    if values is None:
        values = tuple(max(v[i] for v in tier.checkpoints.values()) for i in range(3))
    gen, prompt, mean = (QUANT_FACTOR * v for v in values)
    how = (f"quantization tier {quantization} ({tier.what}): {QUANT_FACTOR:g} x {where} measured (gen {values[0]:.3g}, "
           f"prompt {values[1]:.3g}, set mean {values[2]:.3g}; {tier.source})")
    return Tolerance("float32", gen, prompt, derivation=how, mean_tol=mean, divergence_by_value=True)
