"""How far a correct float32 model moves when only the arithmetic of its RoPE angles changes, by position: the
measurement behind rope_spread.MEASURED (the oracle's float32 bound by position).

transformers (the goldens) computes each angle as ``position * inv_freq`` in float32, with ``inv_freq = 1 /
base ** (2i / d)`` rounded to float32; llama.cpp (ggml's ``rope_f32``, ggml-cpu/ops.cpp ``ggml_rope_cache_init``)
starts at ``theta = position`` and multiplies by ``theta_scale = powf(base, -2/d)`` once per dimension pair, in
float32. Both are float32 roundings of the same angles, and the rounding grows with the angle, i.e. with the position.
This tool runs transformers (eager, one prompt at a time, the goldens' arithmetic) on the golden prompts with the
cos/sin tables replaced:

- ``float64``: the exact angles (inv_freq and position x inv_freq in float64, cos/sin rounded to float32 once);
- ``ggml``: llama.cpp's angles, emulated step by step in float32 (default RoPE only).

``measure`` prints, per golden checkpoint, the largest |dlogprob| between transformers as it is and with exact
angles in each position bucket (``rope_spread.MEASURED``: the float32 tolerance's position-dependent part,
tolerances.py). ``llamacpp CKPT`` (in a venv with llama-cpp-python, ``NANOVLLM_REF_CACHE`` holding its conversion)
prints per bucket: llama.cpp vs the goldens, transformers with ggml's angles vs the goldens, and llama.cpp vs
transformers with ggml's angles (what is left when both compute the same angles).

    python -m nanovllm_ref.oracle.rope_measure measure [--models a,b]
    python -m nanovllm_ref.oracle.rope_measure llamacpp qwen2-hd64
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from nanovllm_ref.oracle.rope_spread import BUCKET_ENDS, bucket_of

MAX_POSITIONS = 2048


def _inv_freq64(rope: dict, dim: int) -> np.ndarray:
    """inv_freq in float64 for ``rope_type`` default and llama3 (transformers' _compute_llama3_parameters)."""
    inv = 1.0 / (float(rope["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if rope.get("rope_type", "default") == "default":
        return inv
    if rope["rope_type"] != "llama3":
        raise ValueError(f"rope_type {rope['rope_type']!r}: only default and llama3 are emulated")
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    mid = (wavelen <= old / low) & (wavelen >= old / high)
    return np.where(mid, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def _ggml_angles(base: float, dim: int, n: int) -> np.ndarray:
    """[n, dim/2] angles as ggml's rope cache computes them: theta = pos; theta *= powf(base, -2/dim), float32."""
    scale = np.power(np.float32(base), np.float32(-2.0) / np.float32(dim), dtype=np.float32)
    theta = np.arange(n, dtype=np.float32)
    out = np.empty((n, dim // 2), np.float32)
    for i in range(dim // 2):
        out[:, i] = theta
        theta = (theta * scale).astype(np.float32)
    return out


def cos_sin(variant: str, rope: dict, dim: int, n: int = MAX_POSITIONS) -> tuple[np.ndarray, np.ndarray]:
    """The [n, dim] cos and sin tables (halves repeated, transformers' layout) of a variant, as float32."""
    if variant == "float64":
        angles = np.arange(n, dtype=np.float64)[:, None] * _inv_freq64(rope, dim)[None]
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    elif variant == "ggml":
        if rope.get("rope_type", "default") != "default":
            raise ValueError("the ggml emulation covers rope_type default only")
        angles = _ggml_angles(float(rope["rope_theta"]), dim, n)
        cos, sin = np.cos(angles, dtype=np.float32), np.sin(angles, dtype=np.float32)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)


def hf_with_angles(model_path: str, variant: str | None):
    """HFAdapter (float32, eager) whose rotary embedding returns the variant's tables (None: unchanged)."""
    import torch

    from nanovllm_ref.oracle.adapters import HFAdapter

    hf = HFAdapter(model_path, "float32")
    if variant is None:
        return hf
    cfg = hf.model.config
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cos, sin = (torch.from_numpy(t) for t in cos_sin(variant, dict(cfg.rope_parameters), dim))
    hf.model.model.rotary_emb.forward = lambda x, position_ids: (cos[position_ids].to(x.dtype),
                                                                 sin[position_ids].to(x.dtype))
    return hf


def by_bucket(ref: Sequence, cand: Sequence) -> list[float]:
    """Per position bucket (BUCKET_ENDS), the largest |dlogprob| over the shared top-k tokens of every prompt
    position and generated step (position = the token's index in the sequence), up to a first differing token."""
    worst = [0.0] * len(BUCKET_ENDS)
    for r, c in zip(ref, cand):
        n = len(r.prompt_logprobs or [])
        rows = [(p, a, b) for p, (a, b) in enumerate(zip(r.prompt_logprobs or [], c.prompt_logprobs or [])) if a and b]
        for i, (a, b) in enumerate(zip(r.topk, c.topk)):
            rows.append((n + i, a, b))
            if r.token_ids[i] != c.token_ids[i]:
                break
        for pos, a, b in rows:
            k = bucket_of(pos)
            if k is not None:
                worst[k] = max(worst[k], max(abs(a[t] - b[t]) for t in a.keys() & b.keys()))
    return worst


def _generate(hf, ref) -> list:
    try:
        return hf.generate(ref.prompts, ref.max_tokens, ref.top_k, True)
    finally:
        hf.close()


def measure(models: list[str]) -> None:
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.references import golden_reference

    print(f"# position buckets end at {BUCKET_ENDS}: transformers float32 vs the same with exact (float64) angles")
    for name in models:
        ref = golden_reference(name, "float32")
        plain = _generate(hf_with_angles(checkpoint_path(name), None), ref)
        exact = _generate(hf_with_angles(checkpoint_path(name), "float64"), ref)
        print(f'    "{name}": ({", ".join(f"{v:.2e}" for v in by_bucket(plain, exact))}),', flush=True)


def llamacpp(name: str) -> None:
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.llamacpp_adapter import LlamaCppAdapter
    from nanovllm_ref.oracle.references import golden_reference

    ref = golden_reference(name, "float32")
    gg = _generate(hf_with_angles(checkpoint_path(name), "ggml"), ref)
    lc = _generate(LlamaCppAdapter(checkpoint_path(name)), ref)
    print(f"{name}, max |dlogprob| per position bucket (ends {BUCKET_ENDS}):")
    for label, a, b in (("llama.cpp vs goldens", ref.outputs, lc), ("transformers + ggml angles vs goldens",
                        ref.outputs, gg), ("llama.cpp vs transformers + ggml angles", gg, lc)):
        print(f"  {label:42s} " + "  ".join(f"{v:.3g}" for v in by_bucket(a, b)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="the table of rope_spread.MEASURED")
    m.add_argument("--models", default="", help="comma-separated golden checkpoints (default: all)")
    sub.add_parser("llamacpp", help="llama.cpp vs transformers with its angles").add_argument("checkpoint")
    args = p.parse_args(argv)
    if args.cmd == "measure":
        from golden.load import list_checkpoints

        measure([m for m in args.models.split(",") if m] or list_checkpoints())
    else:
        llamacpp(args.checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
