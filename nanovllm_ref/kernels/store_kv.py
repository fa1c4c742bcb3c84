"""KV store: write this step's K and V into the paged cache through a slot mapping (-1 = skip).

Reference semantics: `k_cache.view(-1, H, D)[slot] = key[i]` for every token i with slot = slot_mapping[i] >= 0.

Triton kernel (`store_kv`): a pure scatter-copy, so the only goal is to move bytes at DRAM speed.
- One program per token: it copies the whole `(num_kv_heads, head_dim)` row of K and of V (a few KiB),
  which is enough bytes in flight per program to saturate HBM once there are thousands of tokens, and makes
  the -1 skip a single scalar branch (padding tokens cost one 4-byte load).
- The tile is `(BLOCK_H, BLOCK_D)` = next powers of two of `(num_kv_heads, head_dim)` with masks, so any head
  count and any head_dim (80, 96, ...) work; the innermost dimension is contiguous, so loads and stores
  vectorize to 16 bytes (Triton specializes strides equal to 1).
- Slots are widened to int64 before multiplying by the cache strides: a large cache has more than 2**31
  elements.
- An fp8 cache (kv_scales given): each element is divided by its KV head's scale, clamped to +-448 and
  converted, in registers (the rule of kernels/kv_quant.py; the division is IEEE-rounded, as torch's).
The same pattern is vLLM's `reshape_and_cache` (csrc/cache_kernels.cu) and the store in vLLM's Triton backend.
"""

from __future__ import annotations

import torch

from ._triton_common import tl, triton, upcast_dots
from .kv_quant import quantize_kv, split_scales


def store_kv_reference(
    key: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    value: torch.Tensor,  # (num_tokens, num_kv_heads, head_dim)
    k_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    v_cache: torch.Tensor,  # (num_blocks, block_size, num_kv_heads, head_dim)
    slot_mapping: torch.Tensor,  # (num_tokens,) int, -1 = padding token, not stored
    kv_scales: torch.Tensor | None = None,  # (2, num_kv_heads) float32: an fp8 cache's K and V scales
) -> None:
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    key, value = key[valid], value[valid]
    if kv_scales is not None:
        k_scale, v_scale = split_scales(kv_scales)
        key, value = quantize_kv(key, k_scale), quantize_kv(value, v_scale)
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key.to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value.to(v_cache.dtype)


if triton is not None:
    from ._triton_common import to_e4m3

    @triton.jit
    def _store_kv_kernel(
        key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
        kv_scale_ptr,  # (2, num_kv_heads) float32 K and V scales (FP8 only)
        stride_kt, stride_kh, stride_kd,  # key strides (token, head, dim)
        stride_vt, stride_vh, stride_vd,  # value strides
        stride_cb, stride_cs, stride_ch, stride_cd,  # cache strides (block, row, head, dim); K and V share them
        num_kv_heads, head_dim,
        BLOCK_SIZE: tl.constexpr,  # cache block (page) size
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
        FP8: tl.constexpr, EXACT_ROUND: tl.constexpr,
    ):
        tok = tl.program_id(0)
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot < 0:  # padding token (e.g. CUDA-graph batch padding): nothing to store
            return
        block = slot // BLOCK_SIZE
        row = slot % BLOCK_SIZE
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)  # (BLOCK_H, BLOCK_D)
        tok64 = tok.to(tl.int64)
        src_k = key_ptr + tok64 * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd
        src_v = value_ptr + tok64 * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd
        dst = block * stride_cb + row * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :] * stride_cd
        k = tl.load(src_k, mask=mask)
        v = tl.load(src_v, mask=mask)
        if FP8:
            h_mask = offs_h < num_kv_heads
            k_scale = tl.load(kv_scale_ptr + offs_h, mask=h_mask, other=1.0)[:, None]  # (BLOCK_H, 1)
            v_scale = tl.load(kv_scale_ptr + num_kv_heads + offs_h, mask=h_mask, other=1.0)[:, None]
            k = to_e4m3(tl.math.div_rn(k.to(tl.float32), k_scale), EXACT_ROUND)
            v = to_e4m3(tl.math.div_rn(v.to(tl.float32), v_scale), EXACT_ROUND)
        # the reference casts to the cache dtype (e.g. an fp32 activation into a bf16 cache)
        tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, kv_scales: torch.Tensor | None = None) -> None:
    """Triton version of `store_kv_reference` (same arguments, slots int32 or int64; in place). CUDA-graph safe:
    no host sync."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape and slot_mapping.shape[0] == num_tokens
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[2:] == (num_kv_heads, head_dim)
    if num_tokens == 0:
        return
    block_h, block_d = triton.next_power_of_2(num_kv_heads), triton.next_power_of_2(head_dim)
    tile_bytes = block_h * block_d * key.element_size()
    # ~16 bytes per thread per tensor: 1 KiB tile -> 2 warps, 2 KiB (8 heads x 128, bf16) -> 4 warps
    num_warps = max(1, min(8, tile_bytes // 512))
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, slot_mapping if kv_scales is None else kv_scales,
        *key.stride(), *value.stride(), *k_cache.stride(),
        num_kv_heads, head_dim,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=block_h, BLOCK_D=block_d, FP8=kv_scales is not None,
        EXACT_ROUND=upcast_dots(key.device),
        num_warps=num_warps,
    )
