"""Fused mixture-of-experts MLP: each token's top-k SwiGLU experts, weighted and summed.

    out[t] = sum_j  w[t, j] * down[e](silu(gate[e] x[t]) * up[e] x[t]),   e = topk_ids[t, j]

Arithmetic of transformers' Qwen3-MoE experts (`integrations/moe.py` grouped_mm path, the default of
`modeling_qwen3_moe.py`): every projection rounded to the model dtype, SiLU-and-mul as `silu_and_mul_reference`,
the routing weight (already in the model dtype) multiplied in the model dtype, then the k weighted rows of a
token summed with `.sum(dim=1)` (float32 accumulation for 16-bit types, one rounding).

Triton path (`fused_moe`, after vLLM's `fused_moe.py` / `moe_align_block_size`): the (token, slot) pairs are
sorted by expert and each expert's run is padded to a multiple of BLOCK_M, so every M-block of rows belongs to
one expert; one grouped-GEMM launch over (M-block, N-tile) computes gate_up for all experts, `silu_and_mul`
runs in between, a second launch computes down and multiplies the routing weight, and the k rows per token
are summed as above. The alignment is done with device ops of static size (no host sync: CUDA-graph safe).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ._triton_common import dot_precision, tl, triton, upcast_dots
from .activation import silu_and_mul, silu_and_mul_reference


def fused_moe_ref(
    x: torch.Tensor,  # (T, H)
    w_gate_up: torch.Tensor,  # (E, 2 * I, H): gate rows then up rows
    w_down: torch.Tensor,  # (E, H, I)
    topk_weights: torch.Tensor,  # (T, K) in x.dtype
    topk_ids: torch.Tensor,  # (T, K) integer expert ids
    linear: Callable = F.linear,  # the product (the batch-invariant mode passes kernels/matmul.py's)
) -> torch.Tensor:  # (T, H)
    """Pure-torch reference: a loop over the experts that have tokens, each row written to its (token, slot)."""
    num_tokens, k = topk_ids.shape
    flat_ids, flat_w = topk_ids.reshape(-1), topk_weights.reshape(-1)
    rows = x.new_zeros(num_tokens * k, x.shape[1])  # (T * K, H): one row per (token, slot)
    for e in flat_ids.unique().tolist():
        pairs = (flat_ids == e).nonzero().squeeze(1)  # (n_e,) indices into the (token, slot) pairs
        h = silu_and_mul_reference(linear(x[pairs // k], w_gate_up[e]))  # (n_e, I)
        rows[pairs] = linear(h, w_down[e]) * flat_w[pairs, None]
    return rows.view(num_tokens, k, -1).sum(dim=1)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs sorted by expert, each expert's run padded to a multiple of block_m (static sizes, no host sync).

    Returns `sorted_pairs (num_blocks * block_m,)` int32 pair indices (padding = T*K) and `block_expert
    (num_blocks,)` int32 expert of each M-block (-1 for the unused blocks at the end)."""
    flat = topk_ids.reshape(-1).long()  # (S,), S = T * K
    s = flat.numel()
    num_blocks = triton.cdiv(s, block_m) + min(num_experts, s)  # upper bound on sum_e ceil(n_e / block_m)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m  # (E,) rows of each expert's run
    padded_end = torch.cumsum(padded, 0)
    padded_start, start = padded_end - padded, torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)  # (S,) pair indices grouped by expert
    e_sorted = flat[order]
    dest = padded_start[e_sorted] + torch.arange(s, device=flat.device) - start[e_sorted]
    sorted_pairs = torch.full((num_blocks * block_m,), s, dtype=torch.int32, device=flat.device)
    sorted_pairs[dest] = order.to(torch.int32)
    block_start = torch.arange(num_blocks, device=flat.device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    return sorted_pairs, torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)


if triton is not None:

    @triton.jit(do_not_specialize=["num_pairs"])  # tokens x top_k changes every step: one compiled variant
    def _moe_gemm_kernel(
        a_ptr, w_ptr, c_ptr, sorted_pairs_ptr, block_expert_ptr, weights_ptr,
        N, K, num_pairs, a_row_div,  # A row of pair p is p // a_row_div (top_k for gate_up, 1 for down)
        stride_am, stride_we, stride_wn, stride_wk, stride_cm,
        MUL_WEIGHT: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        """C[p, n] = sum_k A[p // a_row_div, k] * W[e, n, k] for the pairs p of one expert's M-block."""
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        if expert < 0:
            return
        pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # (BLOCK_M,)
        row_ok = pairs < num_pairs
        a_rows = (pairs // a_row_div).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        w_base = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn  # (1, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            a = tl.load(a_ptr + a_rows[:, None] * stride_am + offs_k[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_K)
            w = tl.load(w_base + offs_k[:, None] * stride_wk, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if UPCAST:  # interpreter: see _triton_common.upcast_dots
                acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(a, w, input_precision=PREC)
        out = acc.to(c_ptr.dtype.element_ty)  # the projection rounded to the model dtype
        if MUL_WEIGHT:  # the routing weight, multiplied in the model dtype
            wt = tl.load(weights_ptr + pairs, mask=row_ok, other=0.0).to(tl.float32)
            out = (out.to(tl.float32) * wt[:, None]).to(c_ptr.dtype.element_ty)
        tl.store(c_ptr + pairs.to(tl.int64)[:, None] * stride_cm + offs_n[None, :], out,
                 mask=row_ok[:, None] & n_ok[None, :])


def _grouped_gemm(a: torch.Tensor, w: torch.Tensor, sorted_pairs: torch.Tensor, block_expert: torch.Tensor,
                  num_pairs: int, a_row_div: int, weights: torch.Tensor | None, block_m: int,
                  invariant: bool = False) -> torch.Tensor:
    """(S, N) rows: pair p gets A[p // a_row_div] @ W[expert(p)].T (times its routing weight if given)."""
    n, k = w.shape[1], w.shape[2]
    c = torch.empty(num_pairs, n, dtype=a.dtype, device=a.device)
    block_n = 64 if n <= 1024 or num_pairs <= 1024 or invariant else 128
    grid = (block_expert.numel(), triton.cdiv(n, block_n))
    _moe_gemm_kernel[grid](
        a, w, c, sorted_pairs, block_expert, weights if weights is not None else c,
        n, k, num_pairs, a_row_div,
        a.stride(0), w.stride(0), w.stride(1), w.stride(2), c.stride(0),
        MUL_WEIGHT=weights is not None, UPCAST=upcast_dots(a.device), PREC=dot_precision(a.dtype),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=64 if k >= 64 else 32, num_warps=4 if block_m <= 32 else 8,
    )
    return c


def fused_moe(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, invariant: bool = False) -> torch.Tensor:
    """Triton version of `fused_moe_ref`, same arguments (two grouped-GEMM launches, see the module docstring);
    `invariant`: one tile whatever the batch (the batch-invariant mode)."""
    num_tokens, k = topk_ids.shape
    if num_tokens == 0:
        return torch.zeros_like(x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    pairs_per_expert = num_tokens * k / w_gate_up.shape[0]
    block_m = 16 if pairs_per_expert <= 16 or invariant else 32 if pairs_per_expert <= 128 else 64
    sorted_pairs, block_expert = moe_align(topk_ids, w_gate_up.shape[0], block_m)
    s = num_tokens * k
    h = silu_and_mul(_grouped_gemm(x, w_gate_up, sorted_pairs, block_expert, s, k, None, block_m, invariant))  # (S, I)
    weights = topk_weights.reshape(-1).contiguous()  # (S,)
    rows = _grouped_gemm(h, w_down, sorted_pairs, block_expert, s, 1, weights, block_m, invariant)  # (S, H)
    return rows.view(num_tokens, k, -1).sum(dim=1)  # (T, H)
