"""Sweep the batch-invariant GEMM's configuration (kernels/matmul.py: tile and split of K) per layer shape of the
headline's model, against cuBLAS, and write the fastest invariant one of each shape for the engine.

    python -m perf.invariant_tile [--json OUT.json] [--write] [--budget-s S] [--layers L,..] [--tiles T ..]

Each candidate (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages, SPLIT_K) is timed on Qwen3-0.6B's products
(qkv, o, gate_up, down, LM head) at a decode step of 256 rows and a prefill step of 8,192 rows: CUDA-graph
replays of 10 calls (the engine replays decode steps as graphs, so launch overhead is left out), median of 5,
weighted by how often the headline runs them (1,024 decode and 18 prefill steps; 28 layers; the LM head at 256
rows in both). Each is checked first: within bf16 rounding of F.linear, and a row bitwise the same alone, at row
200 of 256 and at row 200 of 8,192 (the three take both of the kernel's split-K paths); a candidate that is not
invariant is dropped. `--write` stores the fastest invariant candidate per shape in kernels/invariant_gemm.json.
`--layers` sweeps some layers only (`--write` then keeps the others' entries); `--tiles` times these
configurations ("BM,BN,BK,G,warps,stages,split") against each layer's current one instead of the built-in list.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from nanovllm_ref.kernels import matmul
from nanovllm_ref.kernels.matmul import invariant_linear

LAYERS = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024)}  # (N, K)
STEPS = {256: 1024, 8192: 18}  # rows -> steps of the headline at that size
TILES = ("64,128,64,8,4,4", "64,64,64,8,4,4", "128,128,64,8,8,3", "64,32,64,8,4,4", "128,64,64,8,4,4")
SPLITS = {1024: (1, 2, 3, 4), 2048: (1, 2, 4, 8), 3072: (1, 2, 3, 6)}


def candidates(n: int, k: int, tiles: list[str] | None = None) -> list[tuple[int, ...]]:
    """`tiles` given: the layer's current configuration, then those. Else every unsplit tile first, then the
    splits nearest two programs per SM (264 on the H200) at a decode step of 256 rows (a first sweep found the wide
    layers fastest unsplit, the narrow ones split)."""
    if tiles:
        current = matmul.gemm_config(n, k)
        return [current] + [c for c in (tuple(map(int, t.split(","))) for t in tiles) if c != current]
    splits = (1,) if n > 16384 else SPLITS.get(k, (1, 2, 4))
    configs = [(*map(int, t.split(",")), s) for s in splits for t in TILES]
    return sorted(configs, key=lambda c: (c[6] > 1, abs(math.log(-(-256 // c[0]) * -(-n // c[1]) * c[6] / 264))))


def _time(fn, calls: int = 10, reps: int = 5) -> float:
    """Milliseconds per call, from CUDA-graph replays of `calls` calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return sorted(times)[reps // 2]


def weighted_ms(product, n: int, k: int, name: str) -> float:
    """Headline-weighted milliseconds of one layer's products (28 layers, or one LM head per step)."""
    total = 0.0
    for rows, steps in STEPS.items():
        x = torch.randn(256 if name == "lm_head" else rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        total += steps * (1 if name == "lm_head" else 28) * _time(lambda x=x, w=w: product(x, w))
    return total


def invariant(n: int, k: int, config: tuple[int, ...]) -> bool:
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(n, k, device="cuda", generator=gen) / 16).to(torch.bfloat16)
    x = torch.randn(256 if n > 16384 else 8192, k, device="cuda", generator=gen).to(torch.bfloat16)
    full = invariant_linear(x[:256], w, config=config)
    ref = F.linear(x[:256].float(), w.float())
    if (full.float() - ref).abs().max() > 0.05 * ref.abs().max():
        return False
    rows = [invariant_linear(x[200:201], w, config=config)[0], full[200]]
    if x.shape[0] > 256:
        rows.append(invariant_linear(x, w, config=config)[200])
    return all(torch.equal(r, rows[0]) for r in rows[1:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--write", action="store_true", help="store the best per shape in kernels/invariant_gemm.json")
    p.add_argument("--budget-s", type=float, default=600.0, help="per layer: stop trying candidates after this long")
    p.add_argument("--layers", default=",".join(LAYERS), help="comma-separated names of LAYERS to sweep")
    p.add_argument("--tiles", nargs="*", default=None, help="configurations to try against the current ones")
    args = p.parse_args(argv)
    layers = {name: LAYERS[name] for name in args.layers.split(",")}
    results, best = {}, {}
    for name, (n, k) in layers.items():
        end = time.monotonic() + args.budget_s
        row = results[name] = {"cublas_ms": weighted_ms(F.linear, n, k, name), "candidates": {}}
        for config in candidates(n, k, args.tiles):
            if time.monotonic() > end:
                break
            key = ",".join(map(str, config))
            try:
                ok = invariant(n, k, config)
                ms = weighted_ms(lambda x, w, c=config: invariant_linear(x, w, config=c), n, k, name)
            except Exception as e:  # a tile that does not compile (shared memory) is skipped
                print(f"{name} {key}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            row["candidates"][key] = {"invariant": ok, "ms": ms}
            print(f"{name} {key}: invariant {ok}, {ms:.1f} ms ({ms / row['cublas_ms']:.2f}x cuBLAS)", flush=True)
        fine = {c: r["ms"] for c, r in row["candidates"].items() if r["invariant"]}
        if fine:
            best[name] = min(fine, key=fine.get)
            row["best"] = best[name]
    total = sum(r["cublas_ms"] for r in results.values())
    mine = sum(results[name]["candidates"][c]["ms"] for name, c in best.items())
    print("| layer (N, K) | cuBLAS ms | best invariant config (BM,BN,BK,G,warps,stages,split) | ms | x cuBLAS |")
    for name, c in best.items():
        r = results[name]
        print(f"| {name} {layers[name]} | {r['cublas_ms']:.1f} | {c} | {r['candidates'][c]['ms']:.1f} | "
              f"{r['candidates'][c]['ms'] / r['cublas_ms']:.2f} |")
    print(f"all: {mine:.1f} ms against cuBLAS's {total:.1f} ms ({mine / total:.2f}x)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.write and len(best) == len(layers):
        table = json.loads(matmul.CONFIGS_FILE.read_text()) if matmul.CONFIGS_FILE.exists() else {}
        table.update({f"{n},{k}": [int(v) for v in best[name].split(",")] for name, (n, k) in layers.items()})
        matmul.CONFIGS_FILE.write_text(json.dumps(table, indent=1) + "\n")
    return 0 if len(best) == len(layers) else 1


if __name__ == "__main__":
    raise SystemExit(main())
