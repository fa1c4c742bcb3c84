"""RMSNorm, optionally fused with the residual add that precedes it (transformers' arithmetic order).

transformers computes `residual = x + residual` in the model dtype, normalizes in float32, casts back to
the model dtype, then multiplies by the weight in the model dtype; the reference does exactly that.

Triton kernel (`rms_norm`): one program per token row holding the whole (padded, masked) hidden vector in
registers, so x and residual are read once and the sum, the normalized output and the new residual are
written once (the fused add + norm of vLLM's `fused_add_rms_norm`). It keeps the reference's arithmetic
order: every 16-bit op is done in float32 and rounded back to the model dtype at the same points as eager
PyTorch (a float32 sum or product of two 16-bit values is exact, so one rounding gives the 16-bit result).
Only the float32 reduction order and the hardware rsqrt differ from the reference: results agree to float32
rounding before the final cast, not bitwise.
"""

from __future__ import annotations

import torch

from ._triton_common import tl, triton


def rms_norm_reference(
    x: torch.Tensor,  # (num_tokens, hidden)
    weight: torch.Tensor,  # (hidden,)
    eps: float,
    residual: torch.Tensor | None = None,  # (num_tokens, hidden)
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual
        residual = x
    # h * rsqrt(mean(h^2) + eps) in float32, with the small (num_tokens, 1) factor made in place: five ops, two
    # full-size temporaries (torch's F.rms_norm is the same formula bit for bit but costs several times this per call
    # on the CPU path's small decode rows, and it cannot scale in place)
    h = x if x.dtype == torch.float32 else x.float()  # (no dispatch at all in float32: decode calls this often)
    h = h * h.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()  # a new tensor: scaled in place below
    h = h if h.dtype == x.dtype else h.to(x.dtype)
    in_place = weight.dtype == h.dtype or torch.promote_types(weight.dtype, h.dtype) == h.dtype
    out = h.mul_(weight) if in_place else weight * h
    return out if residual is None else (out, residual)


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,  # contiguous (rows, hidden) tensors, w (hidden,)
        hidden, eps,
        BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    ):
        offs = tl.arange(0, BLOCK)
        at = tl.program_id(0).to(tl.int64) * hidden + offs  # this token row's elements
        mask = offs < hidden
        x = tl.load(x_ptr + at, mask=mask, other=0.0)  # (BLOCK,) model dtype
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + at, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # the add, in model dtype
            tl.store(res_out_ptr + at, x, mask=mask)
        h = x.to(tl.float32)
        var = tl.sum(h * h, 0) / hidden  # padded lanes are 0
        h = h * tl.rsqrt(var + eps)
        y = h.to(x_ptr.dtype.element_ty).to(tl.float32)  # cast back to the model dtype, as the reference
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + at, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton version of `rms_norm_reference` (same arguments): returns `out`, or `(out, x + residual)` (new
    tensors)."""
    shape, hidden = x.shape, x.shape[-1]
    x2 = x.reshape(-1, hidden).contiguous()  # (a no-op for the layers' activations)
    out_dtype = torch.promote_types(weight.dtype, x.dtype)  # `weight * h` promotes as torch does
    out = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
    assert residual is None or (residual.shape == shape and residual.dtype == x.dtype)
    r2 = x2 if residual is None else residual.reshape(-1, hidden).contiguous()  # (x2: unused)
    res_out = x2 if residual is None else torch.empty_like(x2)
    block = triton.next_power_of_2(hidden)
    num_warps = max(1, min(16, block // 256))  # ~8 elements per thread
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight.contiguous(), out, res_out, hidden, eps,
            BLOCK=block, HAS_RESIDUAL=residual is not None, num_warps=num_warps,
        )
    out = out.view(shape)
    return out if residual is None else (out, res_out.view(shape))
