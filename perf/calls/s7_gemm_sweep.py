"""Session 7 exploration: the decode GEMMs of the headline (Qwen3-0.6B, M = 64/128/256 rows) on the H200.

cuBLAS (F.linear, x @ W^T with the weight as stored) against the same product with a pre-transposed weight, the
cuBLASLt preference, and a plain Triton tiled GEMM over a sweep of tile configurations. Each timing runs the
GEMM over 28 different weight copies (one per layer, as in a decode step, so the weights come from HBM and not
from the 50 MB L2), CUDA events with the GPU kept busy ahead of the launches (perf/device.time_fn); per-GEMM
microseconds = window / 28, median of 15.

    python3 perf/calls/s7_gemm_sweep.py > gemm.log
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, ".")
from perf.device import time_fn  # noqa: E402


@triton.jit
def _mm(x_ptr, w_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    pid_m, pid_n = pid % num_m, pid // num_m  # m fastest: the programs sharing a weight tile run together
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    x_ptrs = x_ptr + rm[:, None] * K + rk[None, :]
    w_ptrs = w_ptr + rn[:, None] * K + rk[None, :]
    acc = tl.zeros((BM, BN), tl.float32)
    for _ in range(0, K // BK):
        a = tl.load(x_ptrs, mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_ptrs, mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BK
        w_ptrs += BK
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def triton_mm(x, w, y, bm, bn, bk, stages, warps):
    M, K = x.shape
    N = w.shape[0]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _mm[grid](x, w, y, M, N, K, BM=bm, BN=bn, BK=bk, num_stages=stages, num_warps=warps)
    return y


SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
LAYERS = 28


def per_gemm_us(gemm, weights) -> float:
    """Microseconds per call of `gemm(w)`, run once per weight copy in a timed window."""
    return statistics.median(time_fn(lambda: [gemm(w) for w in weights], 15, "cuda", warmup=3)) / LAYERS * 1e6


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    results = []
    for name, (n, k) in SHAPES.items():
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5 for _ in range(LAYERS)]
        wts = [w.t().contiguous() for w in ws]
        for m in (64, 128, 256):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x, ws[0]).float()
            row = {"gemm": name, "M": m, "N": n, "K": k,
                   "bound_us": (n * k * 2) / 4.2e12 * 1e6, "flop_us": 2 * m * n * k / 750e12 * 1e6}
            row["cublas"] = per_gemm_us(functools.partial(F.linear, x), ws)
            row["cublas_nn"] = per_gemm_us(functools.partial(torch.mm, x), wts)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            row["cublaslt"] = per_gemm_us(functools.partial(F.linear, x), ws)
            torch.backends.cuda.preferred_blas_library("cublas")
            best = (1e9, None)
            bms = (64,) if m <= 64 else (64, 128)
            for bm, bn, bk, st, wp in itertools.product(bms, (32, 64, 128), (64, 128), (3, 4, 5), (4, 8)):
                if wp == 8 and bm * bn < 128 * 64:
                    continue
                try:
                    triton_mm(x, ws[0], y, bm, bn, bk, st, wp)
                    err = (y.float() - ref).abs().max().item() / ref.abs().max().item()
                    if err > 2e-2:
                        print(f"  {name} M={m} cfg {bm},{bn},{bk},{st},{wp}: error {err:.3g}", flush=True)
                        continue
                    t = per_gemm_us(lambda w, cfg=(x, y, bm, bn, bk, st, wp): triton_mm(cfg[0], w, *cfg[1:]), ws)
                except Exception as e:  # out of shared memory for a config
                    print(f"  {name} M={m} cfg {bm},{bn},{bk},{st},{wp}: {type(e).__name__}", flush=True)
                    continue
                if t < best[0]:
                    best = (t, (bm, bn, bk, st, wp))
            row["triton_best"], row["triton_cfg"] = best
            results.append(row)
            print(json.dumps(row), flush=True)
    print("\n| gemm | M | N | K | bytes bound | FLOP bound | cuBLAS | cuBLAS NN | cuBLASLt | Triton best (cfg) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['gemm']} | {r['M']} | {r['N']} | {r['K']} | {r['bound_us']:.1f} | {r['flop_us']:.1f} | "
              f"{r['cublas']:.1f} | {r['cublas_nn']:.1f} | {r['cublaslt']:.1f} | {r['triton_best']:.1f} "
              f"{r['triton_cfg']} |")


if __name__ == "__main__":
    main()
