"""Session 7 exploration 3: tile configurations of the varlen prefill attention kernel on the H200.

Workloads (Qwen3-0.6B attention: 16 query heads, 8 KV heads, head_dim 128, bf16, block size 16):
- `headline0`: the headline's first prefill step (its first prompts, the last one cut so that the step holds
  16,384 tokens), fresh prompts (q_len == seq_len);
- `long`: 4 prompts of 4,096 tokens.
Each configuration (BLOCK_Q, BLOCK_N, num_warps, num_stages) is checked against the current default's output,
then timed with CUDA events (perf/device.time_fn), median of 10; TFLOP/s counts the causal pairs.

    python3 perf/calls/s7_prefill_sweep.py
"""

from __future__ import annotations

import functools
import itertools
import statistics
import sys

import torch

sys.path.insert(0, ".")
from nanovllm_ref.kernels.prefill_attention import prefill_attention, prefill_tile_config  # noqa: E402
from perf.device import time_fn  # noqa: E402
from perf.roofline import causal_pairs  # noqa: E402
from perf.workloads import headline  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16


def headline_step0(budget: int = 16384) -> list[int]:
    lens, total = [], 0
    for prompt in headline().prompts:
        take = min(len(prompt), budget - total)
        lens.append(take)
        total += take
        if total == budget:
            break
    return lens


def batch(lens: list[int], dev: str) -> tuple:
    g = torch.Generator(device=dev).manual_seed(0)
    blocks = [-(-n // BLOCK) for n in lens]
    num_blocks = sum(blocks)
    shape = (num_blocks, BLOCK, KV_HEADS, HEAD_DIM)
    k = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g)
    perm = torch.randperm(num_blocks, device=dev, generator=g).to(torch.int32)
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int32, device=dev)
    start = 0
    for i, b in enumerate(blocks):
        tables[i, :b] = perm[start:start + b]
        start += b
    q = torch.randn(sum(lens), HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=g)
    qsl = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    return q, k, v, qsl, seq_lens, tables, HEAD_DIM**-0.5, max(lens)


def main() -> None:
    dev = "cuda"
    for name, lens in (("headline0", headline_step0()), ("long", [4096] * 4)):
        args = batch(lens, dev)
        flops = 4 * HEADS * HEAD_DIM * sum(causal_pairs(n, n) for n in lens)
        ref = prefill_attention(*args)
        default = prefill_tile_config(HEAD_DIM, torch.bfloat16, HEADS // KV_HEADS, max(lens))
        print(f"{name}: {len(lens)} prompts, {sum(lens)} tokens; default {default}", flush=True)
        rows = []
        for bq, bn, warps, stages in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (2, 3, 4)):
            cfg = {"BLOCK_Q": bq, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
            try:
                out = prefill_attention(*args, tile_config=cfg)
                err = (out.float() - ref.float()).abs().max().item()
                if err > 2e-2:
                    print(f"  {cfg}: max difference {err:.3g}", flush=True)
                    continue
                t = statistics.median(time_fn(functools.partial(prefill_attention, *args, tile_config=cfg), 10, dev))
            except Exception as e:  # shared memory / registers
                print(f"  {cfg}: {type(e).__name__}", flush=True)
                continue
            rows.append((t, cfg))
        rows.sort(key=lambda r: r[0])
        base = next(t for t, c in rows if all(c[k] == default[k] for k in c))
        print(f"| {name} config | us | TFLOP/s | vs default |\n| --- | --- | --- | --- |")
        for t, cfg in rows[:8]:
            print(f"| {cfg} | {t * 1e6:.0f} | {flops / t / 1e12:.0f} | {base / t:.2f}x |")
        print(f"| default | {base * 1e6:.0f} | {flops / base / 1e12:.0f} | 1.00x |", flush=True)


if __name__ == "__main__":
    main()
