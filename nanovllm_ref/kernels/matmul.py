"""Batch-invariant matrix products `x @ W.T (+ b)`: a row's result does not depend on the other rows.

cuBLAS and the CPU BLAS pick their tiling, split-K and kernel from the problem's shape, so row i of `x @ W.T`
can change in its last bits when the number of rows changes: a request's logits then depend on what else is in
the batch ("Defeating Nondeterminism in LLM Inference", Thinking Machines, 2025, and its `batch_invariant_ops`;
vLLM's `VLLM_BATCH_INVARIANT`). The engine's `batch_invariant=True` mode sends every linear layer and the LM head
here:

- CUDA (`invariant_linear`): one Triton kernel, its tile and its split of K a function of the layer's (N, K)
  (:func:`gemm_config`) and never of the row count. A split-K makes small decode steps fill the GPU, and stays
  invariant because the number of splits is fixed per layer and the partials are added in split order: by the
  program itself when the step has many tiles, else by a second pass over float32 partials (the same operations
  either way; no atomics). The row count is a runtime argument compiled once (no specialization on it), so
  CUDA-graph buckets and eager steps run the same code.
- CPU and the reference (`invariant_linear_reference`): the rows go through the BLAS :data:`ROW_TILE` at a time
  (the last tile zero-padded), so it always sees the same (ROW_TILE, K) x (K, N) problem.

What the mode makes invariant, and what not (with the attention side, kernels/invariant_attention.py):
- invariant: a request's tokens and logprobs across batch composition and size, its position in the batch,
  prompt chunking (any chunk budget), prefix-cache hits, CUDA-graph buckets and eager steps, async scheduling;
  decode-time and prefill-time logits of a token are one computation (one attention kernel with one tile for
  both), so decode and re-prefill logprobs agree bitwise, which is also why recompute after preemption gives the
  same cache (that case is not in the tests);
- the CPU path relies on the BLAS computing a row alike wherever it sits in a product of a fixed shape (torch's
  CPU BLAS does, tests/kernels/test_matmul.py checks it; numpy's OpenBLAS, e.g., does not);
- not invariant: across GPUs, drivers, triton or torch versions, dtypes, devices (CPU vs CUDA), tensor-parallel
  sizes (TP > 1 sums partial products in the all-reduce's order, which NCCL chooses); MoE routing is per token
  (equal inputs give equal routes, ties broken by index) but the mode is tested on two small MoE checkpoints only;
  an fp8 KV cache goes through the same kernels, untested in this mode.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from ._triton_common import dot_precision, tl, triton, upcast_dots

ROW_TILE = 16  # CPU: rows per BLAS call

# the CUDA kernel's configuration (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, SPLIT_K), a function of
# the layer's (N, K) only, never of the row count: CONFIGS_FILE holds the fastest invariant one per layer shape
# (perf/invariant_tile.py, commit 04813df, wrote it); other shapes take TILE, or NARROW_TILE for narrow outputs, unsplit
TILE, NARROW_TILE, NARROW_N = (64, 128, 64, 8, 4, 4, 1), (64, 32, 64, 8, 4, 4, 1), 2048
CONFIGS_FILE = Path(__file__).with_name("invariant_gemm.json")  # {"N,K": [config]}
SERIAL_TILES = 264  # at least this many output tiles: each program sums its K splits itself (no partials in memory)


@functools.cache
def _tuned() -> dict[tuple[int, int], tuple[int, ...]]:
    table = json.loads(CONFIGS_FILE.read_text()) if CONFIGS_FILE.exists() else {}
    return {tuple(int(v) for v in key.split(",")): tuple(cfg) for key, cfg in table.items()}


def gemm_config(n: int, k: int) -> tuple[int, ...]:
    """The kernel configuration of an (N, K) layer (see TILE)."""
    return _tuned().get((n, k), NARROW_TILE if n <= NARROW_N else TILE)


def invariant_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                               ) -> torch.Tensor:
    """x (..., K), weight (N, K), bias (N,) -> (..., N), ROW_TILE rows per BLAS call."""
    x2 = x.reshape(-1, x.shape[-1])
    m = x2.shape[0]
    if m % ROW_TILE:  # the last tile zero-padded
        x2 = torch.cat([x2, x2.new_zeros(-m % ROW_TILE, x2.shape[1])])
    out = x2.new_empty(x2.shape[0], weight.shape[0])
    for a in range(0, x2.shape[0], ROW_TILE):
        torch.mm(x2[a : a + ROW_TILE], weight.t(), out=out[a : a + ROW_TILE])
    # the bias elementwise, after the product: the same for every row count
    out = out[:m] if bias is None else out[:m] + bias
    return out.view(*x.shape[:-1], weight.shape[0])


if triton is not None:

    @triton.jit(do_not_specialize=["M"])
    def _matmul_kernel(
        a_ptr, w_ptr, c_ptr, bias_ptr, part_ptr, M, N, K, K_SPLIT,  # a (M, K), w (N, K), c (M, N); K contiguous
        stride_am, stride_wn, stride_cm,
        HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr, EVEN_K: tl.constexpr,
        SPLIT_K: tl.constexpr, SERIAL: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):
        # grouped program order (the Triton matmul tutorial): GROUP_M row tiles share each weight tile in L2
        pid = tl.program_id(0)
        tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
        group = pid // (GROUP_M * tiles_n)
        first_m = group * GROUP_M
        size_m = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * tiles_n)) % size_m
        pid_n = (pid % (GROUP_M * tiles_n)) // size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        # rows past M / columns past N wrap onto valid ones (unmasked loads); their results are never stored, and a
        # row's products never mix with another row's
        a_row = a_ptr + (offs_m % M).to(tl.int64)[:, None] * stride_am + offs_k[None, :]  # (BLOCK_M, BLOCK_K)
        w_row = w_ptr + (offs_n % N).to(tl.int64)[:, None] * stride_wn + offs_k[None, :]  # (BLOCK_N, BLOCK_K)
        # K in SPLIT_K splits of K_SPLIT (a multiple of BLOCK_K), each summed BLOCK_K at a time from zero, the
        # splits then added in order 0, 1, ...: here (SERIAL) or by _sum_splits_kernel from the partials; the same
        # float32 operations either way, so a row's bits do not depend on which path its step's row count takes
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in range(SPLIT_K if SERIAL else 1):
            if SERIAL:
                k_lo = i * K_SPLIT
            else:
                k_lo = tl.program_id(1) * K_SPLIT
            k_hi = tl.minimum(K, k_lo + K_SPLIT)
            a_ptrs, w_ptrs = a_row + k_lo, w_row + k_lo
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(k_lo, k_hi, BLOCK_K):
                if EVEN_K:
                    a, w = tl.load(a_ptrs), tl.load(w_ptrs)
                else:
                    k_ok = (k0 + offs_k < k_hi)[None, :]
                    a, w = tl.load(a_ptrs, mask=k_ok, other=0.0), tl.load(w_ptrs, mask=k_ok, other=0.0)
                if UPCAST:  # the interpreter (see _triton_common.upcast_dots)
                    acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, tl.trans(w), acc, input_precision=PREC)
                a_ptrs += BLOCK_K
                w_ptrs += BLOCK_K
            total += acc
        ok = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        if SERIAL:
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            c = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
            tl.store(c, total.to(c_ptr.dtype.element_ty), mask=ok)
        else:  # partials (SPLIT_K, M, N) float32
            part = part_ptr + (tl.program_id(1) * M + offs_m.to(tl.int64))[:, None] * N + offs_n[None, :]
            tl.store(part, total, mask=ok)

    @triton.jit(do_not_specialize=["M"])
    def _sum_splits_kernel(part_ptr, c_ptr, bias_ptr, M, N, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
                           BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # over the M * N outputs (c contiguous)
        ok = offs < M * N
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in range(SPLIT_K):  # in split order, as the SERIAL path
            total += tl.load(part_ptr + s * M * N + offs, mask=ok, other=0.0)
        if HAS_BIAS:
            total += tl.load(bias_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
        tl.store(c_ptr + offs, total.to(c_ptr.dtype.element_ty), mask=ok)


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     config: tuple[int, ...] | None = None, serial: bool | None = None) -> torch.Tensor:
    """Triton version of `invariant_linear_reference` (same arguments), one configuration per layer for every row
    count (`config`: another one, see TILE; `serial`: force the path that sums the K splits, default by tile count)."""
    assert triton is not None, "invariant_linear needs triton; use invariant_linear_reference"
    shape, k = x.shape, x.shape[-1]
    x2 = x.reshape(-1, k)
    x2, weight = (t if t.stride(-1) == 1 else t.contiguous() for t in (x2, weight))
    m, n = x2.shape[0], weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        block_m, block_n, block_k, group_m, warps, stages, split = config or gemm_config(n, k)
        k_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
        split = triton.cdiv(k, k_split)  # no empty split
        tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
        serial = (split == 1 or tiles >= SERIAL_TILES) if serial is None else serial
        part = out if serial else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
        _matmul_kernel[(tiles, 1 if serial else split)](
            x2, weight, out, bias if bias is not None else out, part, m, n, k, k_split,
            x2.stride(0), weight.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, UPCAST=upcast_dots(x.device), PREC=dot_precision(x.dtype),
            EVEN_K=k % block_k == 0, SPLIT_K=split, SERIAL=serial,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, num_warps=warps, num_stages=stages,
        )
        if not serial:
            _sum_splits_kernel[(triton.cdiv(m * n, 1024),)](part, out, bias if bias is not None else out, m, n,
                                                             HAS_BIAS=bias is not None, SPLIT_K=split, BLOCK=1024)
    return out.view(*shape[:-1], n)


def linear_op(batch_invariant: bool, use_kernels: bool) -> Callable[..., torch.Tensor]:
    """The product `(x, weight, bias) -> x @ weight.T + bias` a layer takes, picked once when it is built: F.linear,
    or in the engine's batch_invariant mode the Triton kernel (use_kernels: CUDA) or the row-tiled BLAS."""
    if not batch_invariant:
        return F.linear
    return invariant_linear if use_kernels else invariant_linear_reference
