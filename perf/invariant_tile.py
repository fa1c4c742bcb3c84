"""Sweep the batch-invariant GEMM's one tile (kernels/matmul.py) on the headline's shapes, against cuBLAS.

    python -m perf.invariant_tile --json OUT.json     # prints each tile's time, writes the best as "best"

Each candidate is timed (CUDA events, median of 20) on Qwen3-0.6B's five products at a decode step of 256 rows
and a prefill step of 8,192 rows, weighted by how often the headline runs them (1,024 decode steps, 18 prefill
steps; the LM head at 256 rows in both), and checked: within bf16 rounding of F.linear, and a row bitwise the
same alone and at row 200 of 256 (a tile that is not invariant is dropped). The wide layers (qkv, gate_up, LM
head) and the narrow ones (o_proj, down_proj: kernels/matmul.py's NARROW_N) are timed apart: `best` and
`best_narrow` are the fastest invariant tiles of each (the candidates are set as the module's TILE and NARROW_TILE).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from nanovllm_ref.kernels import matmul
from nanovllm_ref.kernels.matmul import NARROW_N, invariant_linear

# (K, N) of Qwen3-0.6B's qkv, o, gate_up, down projections, then the LM head
SHAPES = ((1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024))
LM_HEAD = (1024, 151936)
STEPS = {256: 1024, 8192: 18}  # rows -> steps of the headline at that size
CANDIDATES = ("64,128,64,8,4,4", "64,64,64,8,4,4", "64,32,64,8,4,4", "64,32,128,8,4,3", "128,128,64,8,8,3",
              "128,64,64,8,4,4")


def _time(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[reps // 2]


def weighted_ms(product, narrow: bool | None = None) -> float:
    """Headline-weighted milliseconds of the products (28 layers of the four, one LM head per step); `narrow`:
    only the narrow (True) or the wide (False) layers."""
    total = 0.0
    for rows, steps in STEPS.items():
        layer = 0.0
        for k, n in SHAPES:
            if narrow is not None and (n <= NARROW_N) != narrow:
                continue
            x, w = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda",
                                                                                           dtype=torch.bfloat16)
            layer += _time(lambda x=x, w=w: product(x, w))
        x, w = (torch.randn(256, LM_HEAD[0], device="cuda", dtype=torch.bfloat16),
                torch.randn(LM_HEAD[1], LM_HEAD[0], device="cuda", dtype=torch.bfloat16))
        total += steps * (28 * layer + (0.0 if narrow else _time(lambda x=x, w=w: product(x, w))))
    return total


def invariant(tile: str) -> bool:
    matmul.TILE = matmul.NARROW_TILE = tuple(int(v) for v in tile.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for k, n in (*SHAPES, LM_HEAD):
        w = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16) / 16
        x = torch.randn(256, k, device="cuda", generator=gen).to(torch.bfloat16)
        full = invariant_linear(x, w)
        ref = F.linear(x.float(), w.float())
        if (full.float() - ref).abs().max() > 0.05 * ref.abs().max():
            return False
        if not torch.equal(invariant_linear(x[200:201], w)[0], full[200]):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    results = {"cublas_ms": weighted_ms(F.linear)}
    print(f"cuBLAS (F.linear): {results['cublas_ms']:.1f} ms over the headline's products", flush=True)
    for tile in CANDIDATES:
        try:
            ok = invariant(tile)
            ms = {"wide_ms": weighted_ms(invariant_linear, False), "narrow_ms": weighted_ms(invariant_linear, True)}
        except Exception as e:  # a tile that does not compile (shared memory) is skipped
            print(f"tile {tile}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        results[tile] = {"invariant": ok, **ms}
        print(f"tile {tile}: invariant {ok}, wide layers {ms['wide_ms']:.1f} ms, narrow {ms['narrow_ms']:.1f} ms",
              flush=True)
    tiles = {t: r for t, r in results.items() if isinstance(r, dict) and r["invariant"]}
    for key, kind in (("best", "wide_ms"), ("best_narrow", "narrow_ms")):
        results[key] = min(tiles, key=lambda t, kind=kind: tiles[t][kind]) if tiles else None
    print(f"best: {results['best']}; narrow: {results['best_narrow']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0 if results["best"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
