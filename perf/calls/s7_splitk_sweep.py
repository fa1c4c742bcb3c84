"""Session 7 exploration 2: a split-K GEMM with an in-kernel, fixed-order reduction for the decode GEMMs.

y = x @ W^T, x (M, K) bf16, W (N, K) bf16. Programs: (M tiles) x (N tiles) x SPLITS. Each computes its K chunk's
partial tile in fp32; with SPLITS > 1 it stores the partial to a workspace and increments the tile's arrival
counter; the program that arrives last sums the SPLITS partials in index order (its own from registers), so
the result does not depend on which program finishes last (deterministic), writes y and resets the counter
(CUTLASS's "serial split-K"). One launch, no memset: CUDA-graph friendly.

Timing as s7_gemm_sweep.py: 28 weight copies per window (weights from HBM), CUDA events, median of 15.
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
def _mm_splitk(x_ptr, w_ptr, y_ptr, part_ptr, count_ptr, M, N, K, SPLITS,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BM)
    pid_m, pid_n = pid % num_m, pid // num_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k_chunk = K // SPLITS
    k0 = split * k_chunk
    x_ptrs = x_ptr + rm[:, None] * K + (k0 + rk)[None, :]
    w_ptrs = w_ptr + rn[:, None] * K + (k0 + rk)[None, :]
    acc = tl.zeros((BM, BN), tl.float32)
    for _ in range(0, k_chunk // BK):
        a = tl.load(x_ptrs, mask=rm[:, None] < M, other=0.0)
        b = tl.load(w_ptrs, mask=rn[:, None] < N, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BK
        w_ptrs += BK
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    y_off = rm[:, None] * N + rn[None, :]
    if SPLITS == 1:
        tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        tile = pid
        tile_off = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        part = part_ptr + (tile * SPLITS) * (BM * BN)
        tl.store(part + split * (BM * BN) + tile_off, acc)
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLITS - 1:
            total = tl.zeros((BM, BN), tl.float32)
            for s in range(0, SPLITS):
                if s == split:
                    total += acc
                else:
                    total += tl.load(part + s * (BM * BN) + tile_off, cache_modifier=".cg")
            tl.store(y_ptr + y_off, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.store(count_ptr + tile, 0)


class SplitK:
    def __init__(self, dev: str) -> None:
        self.part = torch.empty(64 << 20, device=dev, dtype=torch.float32)
        self.count = torch.zeros(1 << 16, device=dev, dtype=torch.int32)

    def __call__(self, x, w, y, bm, bn, bk, splits, stages, warps):
        M, K = x.shape
        N = w.shape[0]
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        _mm_splitk[(tiles, splits)](x, w, y, self.part, self.count, M, N, K, splits,
                                    BM=bm, BN=bn, BK=bk, num_stages=stages, num_warps=warps)
        return y


SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024)}
LAYERS = 28


def per_gemm_us(gemm, weights) -> float:
    """Microseconds per call of `gemm(w)`, run once per weight copy in a timed window."""
    return statistics.median(time_fn(lambda: [gemm(w) for w in weights], 15, "cuda", warmup=3)) / len(weights) * 1e6


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    mm = SplitK(dev)
    results = []
    for name, (n, k) in SHAPES.items():
        layers = 2 if name == "lm_head" else LAYERS
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5 for _ in range(layers)]
        for m in (16, 64, 128, 256):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            ref = F.linear(x, ws[0]).float()
            row = {"gemm": name, "M": m, "N": n, "K": k, "bound_us": (n * k * 2) / 4.2e12 * 1e6,
                   "cublas": per_gemm_us(functools.partial(F.linear, x), ws)}
            best = (1e9, None)
            bms = sorted({max(16, min(triton.next_power_of_2(m), 64)), min(m, 128)} if m > 16 else {16})
            for bm, bn, bk, stages, warps in itertools.product(bms, (32, 64, 128), (64, 128), (3, 5), (4, 8)):
                if warps == 8 and bm * bn < 128 * 128:
                    continue
                tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
                for splits in (1, 2, 4, 8, 16):
                    if k % (splits * bk) or (splits > 1 and tiles * splits > 4096) or tiles > 60000:
                        continue
                    if splits > 1 and tiles * splits > 8 * 132:
                        continue
                    try:
                        mm(x, ws[0], y, bm, bn, bk, splits, stages, warps)
                        err = (y.float() - ref).abs().max().item() / ref.abs().max().item()
                        if err > 2e-2:
                            print(f"  {name} M={m} {bm},{bn},{bk},{splits},{stages},{warps}: error {err:.3g}")
                            continue
                        t = per_gemm_us(
                            lambda w, c=(x, y, bm, bn, bk, splits, stages, warps): mm(c[0], w, *c[1:]), ws)
                    except Exception as e:  # shared memory
                        print(f"  {name} M={m} {bm},{bn},{bk},{splits},{stages},{warps}: {type(e).__name__}")
                        continue
                    if t < best[0]:
                        best = (t, (bm, bn, bk, splits, stages, warps))
            row["triton"], row["cfg"] = best
            results.append(row)
            print(json.dumps(row), flush=True)
    print("\n| gemm | M | N | K | bytes bound us | cuBLAS us | split-K Triton us | cfg (BM, BN, BK, splits, stages, "
          "warps) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['gemm']} | {r['M']} | {r['N']} | {r['K']} | {r['bound_us']:.1f} | {r['cublas']:.1f} | "
              f"{r['triton']:.1f} | {r['cfg']} |")


if __name__ == "__main__":
    main()
