"""The float32 spread of RoPE angle arithmetic on the golden checkpoints, by position (tolerances.py uses it).

Each rotary angle ``position x inv_freq`` is rounded to float32 before its cos/sin, so a correct float32 engine is
off the exact angles by up to a few ulps of the angle: ~1e-5 rad at position 300 in transformers (the goldens) and
in llama.cpp alike (its ggml rope multiplies ``theta`` by ``base^(-2/d)`` once per dimension pair), growing with the
position. The goldens' two re-computations (eager vs sdpa) share one cos/sin table, so their noise never shows it;
on the checkpoints rescaled after training (sharpened attention, huge hidden states) it exceeds the float32 floor at
late positions: qwen2-hd64 reaches 6.4e-5 in transformers and 1.3e-4 between llama.cpp and the goldens, while
llama.cpp vs transformers computing llama.cpp's angles differ by 2.4e-5 at most (conformance/README.md, "Peers").

``MEASURED[checkpoint][k]``: the largest |dlogprob| (shared top-20 logprobs of every prompt position and generated
step of the golden prompts; position = the token's index in the sequence) in bucket ``k`` between transformers
float32 as the goldens run it and the same with exact angles (float64 inv_freq and products, cos/sin rounded once);
``python -m nanovllm_ref.oracle.rope_measure measure`` (CPU, torch 2.13, transformers 5.24, 2026-12-01) printed it.
"""

from __future__ import annotations

BUCKET_ENDS = (64, 128, 256, 512)  # position buckets [0, 64), [64, 128), [128, 256), [256, 512)
SOURCE = "python -m nanovllm_ref.oracle.rope_measure measure (2026-12-01)"
MEASURED: dict[str, tuple[float, float, float, float]] = {
    "llama3-bias-hd32": (1.17e-05, 1.14e-05, 2.57e-05, 3.77e-05),
    "llama3-tiny": (1.38e-05, 1.24e-05, 2.69e-05, 4.72e-05),
    "mistral-hd64": (1.24e-05, 2.48e-05, 4.24e-05, 2.38e-05),
    "mistral-spm-hd32": (4.77e-06, 5.72e-06, 5.25e-06, 4.53e-06),
    "mistral-tiny": (1.00e-05, 1.05e-05, 2.19e-05, 1.62e-05),
    "qwen2-hd64": (2.91e-05, 2.34e-05, 6.44e-05, 4.17e-05),
    "qwen2-tiny": (1.10e-05, 2.43e-05, 2.53e-05, 2.05e-05),
    "qwen3-bias-hd32": (8.06e-05, 6.06e-05, 8.01e-05, 1.13e-04),
    "qwen3-gqa4": (9.54e-06, 1.24e-05, 3.67e-05, 2.77e-05),
    "qwen3-hd128": (1.57e-05, 3.72e-05, 3.91e-05, 4.24e-05),  # measured 2026-12-06 (another CPU; same versions)
    "qwen3-moe-tiny": (8.58e-06, 9.54e-06, 1.62e-05, 1.76e-05),
    "qwen3-moe-unnorm-hd32": (1.14e-05, 1.48e-05, 2.29e-05, 3.24e-05),
    "qwen3-tied-hd64": (1.38e-05, 1.43e-05, 3.24e-05, 2.24e-05),
    "qwen3-tiny": (1.19e-05, 1.24e-05, 1.57e-05, 1.81e-05),
    "qwen3-words-hd32": (7.15e-06, 6.44e-06, 9.54e-06, 7.63e-06),
}


def bucket_of(position: int) -> int | None:
    """The index of the bucket holding ``position`` (None beyond the last: nothing measured there)."""
    return next((k for k, end in enumerate(BUCKET_ENDS) if position < end), None)


def envelope(checkpoint: str) -> tuple[tuple[int, float], ...]:
    """``((bucket end, spread), ...)`` for a measured checkpoint, each bucket's spread raised to the largest of the
    buckets before it: the angles' rounding only grows with the position, and a bucket's maximum is a sample (the
    last one holds one prompt, long_300). () for a checkpoint not measured (the bounds are then unchanged)."""
    spread, out = 0.0, []
    for end, value in zip(BUCKET_ENDS, MEASURED.get(checkpoint, ())):
        spread = max(spread, value)
        out.append((end, spread))
    return tuple(out)
