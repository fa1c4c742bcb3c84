"""GPU: a decode step's four GEMMs, cuBLAS against a Triton split-K GEMM whose fp32 partials the next norm sums.

At decode sizes (256 rows, K 1,024-3,072) each cuBLAS GEMM takes ~6-9 us whatever its tile, 3-4x its bytes bound
(perf/RESULTS.md): too few output tiles for 132 SMs, each with a short K loop. Split-K gives every SM work; its
partials (S, M, N) in float32 are summed where the output is read anyway. The projections before a fused
add + RMSNorm (o_proj, down_proj) are timed with that norm, summing the partials in it (`reduce_add_rms_norm`:
the sum rounded to the model dtype, then transformers' add and norm); QKV and gate_up alone (their readers are the
q-k-norm/RoPE epilogue and SiLU). Weights cycle through 8 copies, so each GEMM reads them from HBM as in a step (one
layer's weights are fresh). Timed by triton.testing.do_bench_cudagraph (graph replays, as the decode step runs).

    python -m perf.decode_gemms                  # Qwen3-0.6B's shapes at 256 rows
    python -m perf.decode_gemms --rows 64 256 --arch qwen3-8b
"""

from __future__ import annotations

import argparse
import itertools

import torch

from nanovllm_ref.kernels._triton_common import tl, triton
from nanovllm_ref.testing.bench.models import ModelShape

COPIES = 8
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
TILES = [(64, 64, 128, 4, 3), (64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 128, 128, 4, 3), (128, 64, 64, 4, 4),
         (128, 128, 64, 8, 4)]


@triton.jit
def splitk_kernel(a_ptr, w_ptr, c_ptr, M, N, stride_am, stride_wn, stride_cs, stride_cm,
                  K_SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """c[s] = a[:, s*K_SPLIT:(s+1)*K_SPLIT] @ w[:, same].T in float32, s = program_id(2); K % (S * BK) == 0."""
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = pid_s * K_SPLIT + tl.arange(0, BK)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None]  # (BK, BN): w transposed by its strides
    acc = tl.zeros((BM, BN), tl.float32)
    for _ in range(0, K_SPLIT, BK):
        acc = tl.dot(tl.load(a_ptrs, mask=offs_m[:, None] < M, other=0.0), tl.load(w_ptrs), acc)
        a_ptrs += BK
        w_ptrs += BK
    tl.store(c_ptr + pid_s * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :], acc,
             mask=offs_m[:, None] < M)


@triton.jit
def reduce_add_rms_norm_kernel(p_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, hidden, stride_s, eps,
                               S: tl.constexpr, BLOCK: tl.constexpr):
    """One row: x = sum of the S partials rounded to the model dtype, then kernels/rmsnorm.py's add + norm."""
    offs = tl.arange(0, BLOCK)
    at = tl.program_id(0).to(tl.int64) * hidden + offs
    mask = offs < hidden
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(S):
        acc += tl.load(p_ptr + s * stride_s + at, mask=mask, other=0.0)
    dtype = res_ptr.dtype.element_ty
    x = (acc.to(dtype).to(tl.float32) + tl.load(res_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(dtype)
    tl.store(res_out_ptr + at, x, mask=mask)
    h = x.to(tl.float32)
    y = (h * tl.rsqrt(tl.sum(h * h, 0) / hidden + eps)).to(dtype).to(tl.float32)
    tl.store(out_ptr + at, (tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) * y).to(dtype), mask=mask)


def splitk(x: torch.Tensor, w: torch.Tensor, splits: int, tile: tuple[int, ...],
           out: torch.Tensor | None = None) -> torch.Tensor:
    """(splits, M, N) float32 partial products of x (M, K) and w (N, K)."""
    (m, k), n = x.shape, w.shape[0]
    bm, bn, bk, warps, stages = tile
    out = torch.empty(splits, m, n, device=x.device, dtype=torch.float32) if out is None else out
    splitk_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn), splits)](
        x, w, out, m, n, x.stride(0), w.stride(0), out.stride(0), out.stride(1),
        K_SPLIT=k // splits, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    return out


def reduce_add_rms_norm(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual) with x the partials' sum in the residual's dtype."""
    out, res_out = torch.empty_like(residual), torch.empty_like(residual)
    s, m, n = partials.shape
    reduce_add_rms_norm_kernel[(m,)](partials, residual, weight, out, res_out, n, partials.stride(0), eps,
                                     S=s, BLOCK=triton.next_power_of_2(n), num_warps=4)
    return out, res_out


def gemms(shape: ModelShape) -> dict[str, tuple[int, int, bool]]:
    """name -> (N, K, whether a fused add + RMSNorm reads its output)."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {"qkv": (q + 2 * kv, shape.hidden_size, False), "o": (shape.hidden_size, q, True),
            "gate_up": (2 * shape.intermediate_size, shape.hidden_size, False),
            "down": (shape.hidden_size, shape.intermediate_size, True)}


def sweep(name: str, m: int, n: int, k: int, normed: bool, splits: list[int]) -> None:
    from triton.testing import do_bench_cudagraph

    from nanovllm_ref.kernels.rmsnorm import rms_norm

    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = [torch.randn(n, k, device="cuda", generator=gen).bfloat16() * 0.02 for _ in range(COPIES)]
    xs = [torch.randn(m, k, device="cuda", generator=gen).bfloat16() for _ in range(COPIES)]
    res, norm_w = torch.randn(m, n, device="cuda", generator=gen).bfloat16(), torch.ones(n, device="cuda").bfloat16()
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(COPIES)]

    def cublas():
        for x, w, o in zip(xs, ws, outs):
            torch.matmul(x, w.t(), out=o)
            if normed:
                rms_norm(o, norm_w, 1e-6, res)

    t_ref = do_bench_cudagraph(cublas, rep=50) / COPIES * 1e3
    print(f"{name:8s} M={m} N={n} K={k}: cuBLAS{' + add/RMSNorm' if normed else ''} {t_ref:6.2f} us", flush=True)
    rows = []
    for s, tile in itertools.product(splits if normed else [1], TILES):
        if k % (s * tile[2]):
            continue
        part = torch.empty(s, m, n, device="cuda", dtype=torch.float32)
        got = splitk(xs[0], ws[0], s, tile, part).sum(0)
        err = ((got - xs[0].float() @ ws[0].float().t()).abs().max() / got.abs().max()).item()

        def triton_run(s=s, tile=tile, part=part):
            for x, w in zip(xs, ws):
                splitk(x, w, s, tile, part)
                if normed:
                    reduce_add_rms_norm(part, res, norm_w, 1e-6)

        rows.append((do_bench_cudagraph(triton_run, rep=30) / COPIES * 1e3, s, tile, err))
    for t, s, tile, err in sorted(rows)[:4]:
        print(f"    split {s} tile {'/'.join(map(str, tile))}: {t:6.2f} us ({t / t_ref:.2f}x), rel err {err:.1e}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen3-0.6b")
    ap.add_argument("--rows", type=int, nargs="+", default=[256])
    ap.add_argument("--splits", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    args = ap.parse_args()
    for m, (name, (n, k, normed)) in itertools.product(args.rows, gemms(ModelShape.from_arch(args.arch)).items()):
        sweep(name, m, n, k, normed, args.splits)


if __name__ == "__main__":
    main()
