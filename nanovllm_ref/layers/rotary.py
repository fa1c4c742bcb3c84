"""Rotary position embedding with the `rope_scaling` types this engine implements: "default", "linear" and
"llama3" (Llama 3.1's frequency-dependent scaling). config.rope_parameters reads them from transformers'
`rope_parameters` (v5) or `rope_theta` + `rope_scaling` (v4) and refuses anything else, never run with wrong math.
"""

from __future__ import annotations

import math

import torch

from ..kernels.rotary import rope_cos_sin_cache


def rope_cos_sin_table(head_dim: int, max_positions: int, params: dict) -> torch.Tensor:
    """(max_positions, head_dim) float32: [cos | sin] of each position's angles (kernels/rotary.py), with the
    frequencies of the checkpoint's RoPE type."""
    base = float(params["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = params["rope_type"]
    if kind == "linear":
        inv_freq = inv_freq / float(params["factor"])
    elif kind == "llama3":
        factor, low, high = float(params["factor"]), params["low_freq_factor"], params["high_freq_factor"]
        old_len = params["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return rope_cos_sin_cache(inv_freq, max_positions)

