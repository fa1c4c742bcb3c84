"""FP8 (e4m3) KV cache: the quantization rule every store and every attention read follows, in torch.

A cache in `torch.float8_e4m3fn` holds `q = fp8(clamp(x / s, -448, 448))` for each K or V element x, with one
float32 scale `s` per (layer, KV head) for K and one for V; attention reads `q * s` (computed in float32, the fp8
value being exact in any wider float). Scales of a layer: a `(2, num_kv_heads)` float32 tensor, row 0 for K,
row 1 for V (vLLM's `k_scale` / `v_scale`, per head).

- The clamp saturates what lies outside e4m3's finite range (+-448) instead of leaving the conversion to decide
  (e4m3fn has no infinity; conversions differ: torch saturates, the Triton interpreter wraps, PTX without
  `.satfinite` gives NaN). vLLM's `scaled_fp8_conversion` clamps the same way.
- Where the scales come from (`kv_scales_from_checkpoint`): the checkpoint's `model.layers.{i}.self_attn.k_scale`
  / `v_scale` tensors when it carries them (a scalar or one per KV head, vLLM's names), else 1.0. That default is
  vLLM's for an uncalibrated checkpoint, so engines reading the same checkpoint agree on the scales bit for bit;
  e4m3's normal range (2^-6 .. 448) with 3 mantissa bits (relative step 2^-3) covers post-norm keys and values
  of unit size; a checkpoint whose activations are far from that should carry calibrated scales (amax / 448).
"""

from __future__ import annotations

import glob
import os
import re

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
SCALE_NAME = re.compile(r"model\.layers\.(\d+)\.self_attn\.(k|v)_scale$")


def quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(tokens, kv_heads, head_dim) -> the same in fp8; scale (kv_heads,) float32."""
    return (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor, heads_axis: int = -2) -> torch.Tensor:
    """fp8 rows with the KV heads on `heads_axis` (e.g. (tokens, kv_heads, head_dim)) -> float32 values;
    scale (kv_heads,) float32."""
    shape = [1] * x.dim()
    shape[heads_axis] = -1
    return x.float() * scale.view(shape)


def split_scales(kv_scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's (2, kv_heads) scales -> (K scales, V scales), each (kv_heads,)."""
    return kv_scales[0], kv_scales[1]


def kv_scales_from_checkpoint(path: str, num_layers: int, num_kv_heads: int) -> torch.Tensor:
    """(num_layers, 2, num_kv_heads) float32 scales of every layer's K and V: the checkpoint's, else 1.0."""
    from safetensors import safe_open

    scales = torch.ones(num_layers, 2, num_kv_heads)
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                m = SCALE_NAME.fullmatch(name)
                if m is None or int(m[1]) >= num_layers:
                    continue
                t = f.get_tensor(name).float().reshape(-1)
                if t.numel() not in (1, num_kv_heads) or not bool((t > 0).all() & t.isfinite().all()):
                    raise ValueError(f"checkpoint tensor {name!r}: a KV scale must be one positive finite value or "
                                     f"one per KV head ({num_kv_heads}), got {t.tolist()}")
                scales[int(m[1]), "kv".index(m[2])] = t
    return scales
