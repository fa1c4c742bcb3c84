"""Rotary position embedding with the `rope_scaling` types this engine implements.

Reads transformers' `rope_parameters` (v5) or `rope_theta` + `rope_scaling` (v4). Supported types:
"default", "linear" and "llama3" (Llama 3.1's frequency-dependent scaling); anything else is refused with
an error naming the field, never run with wrong math.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..kernels.rotary import rope_cos_sin_cache

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_parameters(hf_config: Any) -> dict:
    # v5: rope_parameters; v4: rope_scaling (or nothing), with rope_theta at the top level
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("rope_parameters.partial_rotary_factor != 1 is not supported")
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {params['rope_type']!r} (config field rope_scaling/rope_parameters) is not "
            f"supported; supported: {SUPPORTED_ROPE_TYPES}"
        )
    return params


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

