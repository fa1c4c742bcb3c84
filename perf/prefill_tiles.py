"""GPU sweep of the prefill attention kernel's tiles (kernels/prefill_attention.py) over several prompt mixes.

Each shape is one prefill step of fresh prompts packed into a paged cache (16-token blocks): the headline's first
step (its prompts up to 16,384 tokens), 4 x 4,096 and 64 x 256 tokens, at head_dim 64 / 128 and GQA 2 / 4. Each
tile `BLOCK_N/warps/stages` (BLOCK_Q stays prefill_tile_config's: ~128 rows) runs on a bf16 and an fp8 cache,
timed by CUDA events (median of triton.testing.do_bench); its output is checked against the engine's default tile
(bf16 output rounding apart). The table at the end gives each tile's time relative to the first tile given.

    python -m perf.prefill_tiles                                   # the default tiles
    python -m perf.prefill_tiles --tiles 32/8/2 64/4/3 --shapes headline-g2-d128 4x4096-g2-d128
"""

from __future__ import annotations

import argparse
import itertools

import torch

from nanovllm_ref.kernels.kv_quant import quantize_kv
from nanovllm_ref.kernels.prefill_attention import prefill_attention, prefill_tile_config
from nanovllm_ref.testing.bench import workloads

from .invariant_attention import prefill_steps

BLOCK_SIZE, KV_HEADS = 16, 8
TILES = ["32/8/2", "32/4/2", "32/4/3", "64/4/2", "64/4/3", "64/8/3", "32/4/4"]


def headline_lens() -> list[int]:
    """The prompt lengths of the headline's first prefill step (the last prompt chunked to fill the budget)."""
    return [tokens for _, _, tokens in prefill_steps(workloads.headline())[0]]


def shapes() -> dict[str, tuple[list[int], int, int]]:
    """name -> (prompt lengths, query heads, head_dim); 8 KV heads each."""
    first = headline_lens()
    return {"headline-g2-d128": (first, 16, 128), "4x4096-g2-d128": ([4096] * 4, 16, 128),
            "headline-g4-d128": (first, 32, 128), "headline-g2-d64": (first, 16, 64),
            "64x256-g2-d128": ([256] * 64, 16, 128)}


def prefill_inputs(lens: list[int], heads: int, head_dim: int, seed: int = 0):
    """q, bf16 (k, v) caches, fp8 (k, v) caches, scales, block tables, query_start_loc, seq_lens of one step."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = [-(-n // BLOCK_SIZE) for n in lens]
    shape = (sum(blocks), BLOCK_SIZE, KV_HEADS, head_dim)
    bf = tuple(torch.randn(shape, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    scales = torch.rand(2, KV_HEADS, device="cuda", generator=g) / 64 + 1 / 128
    f8 = tuple(quantize_kv(c.view(-1, KV_HEADS, head_dim), scales[i]).view(shape) for i, c in enumerate(bf))
    q = torch.randn(sum(lens), heads, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32, device="cuda")
    for row, (first, n) in enumerate(zip(itertools.accumulate([0, *blocks]), blocks)):
        tables[row, :n] = torch.arange(first, first + n, dtype=torch.int32)
    starts = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    return q, bf, f8, scales, tables, starts, torch.tensor(lens, dtype=torch.int32, device="cuda")


def sweep_shape(name: str, tiles: list[str], times: dict) -> None:
    import triton.testing

    lens, heads, head_dim = shapes()[name]
    q, bf, f8, scales, tables, starts, seq_lens = prefill_inputs(lens, heads, head_dim)
    block_q = prefill_tile_config(head_dim, q.dtype, heads // KV_HEADS, max(lens))["BLOCK_Q"]
    for cache_name, cache, sc in (("bf16", bf, None), ("fp8", f8, scales)):
        def run(cfg=None, cache=cache, sc=sc):
            return prefill_attention(q, *cache, starts, seq_lens, tables, head_dim**-0.5, max(lens), kv_scales=sc,
                                     tile_config=cfg)
        want = run()
        for tile in tiles:
            bn, warps, stages = (int(x) for x in tile.split("/"))
            cfg = {"BLOCK_Q": block_q, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
            try:
                err = float((run(cfg).float() - want.float()).abs().max())
                us = triton.testing.do_bench(lambda cfg=cfg: run(cfg), warmup=10, rep=60, return_mode="median") * 1e3
            except Exception as e:  # a tile that does not fit (shared memory): say so, keep sweeping
                print(f"{name} {cache_name} {tile}: {type(e).__name__}: {str(e)[:100]}")
                continue
            times[(name, cache_name, tile)] = us
            print(f"{name:18s} {cache_name:4s} {tile:8s} {us:8.1f} us  maxerr {err:.1e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", nargs="+", default=TILES, help="BLOCK_N/warps/stages; the first is the reference")
    ap.add_argument("--shapes", nargs="+", default=list(shapes()), choices=list(shapes()))
    args = ap.parse_args()
    times: dict[tuple[str, str, str], float] = {}
    for name in args.shapes:
        sweep_shape(name, args.tiles, times)
    print(f"\ntime relative to {args.tiles[0]}")
    for name, cache_name in itertools.product(args.shapes, ("bf16", "fp8")):
        ref = times.get((name, cache_name, args.tiles[0]))
        cells = [f"{t} {times[(name, cache_name, t)] / ref:.2f}" for t in args.tiles
                 if ref and (name, cache_name, t) in times]
        print(f"{name:18s} {cache_name:4s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
