"""Session 8 exploration 3: how many splits the decode kernel should use when the batch is small.

Call 2's round-2 sweep: at 19 sequences one split took 51 us per layer against the heuristic's three (67 us), while
at 38-61 sequences two or three splits beat one. For each batch size here, the contexts are the headline's own at
the last decode step that still runs that many sequences (workloads.decode_contexts), in 28 back-to-back calls
over 4 rotating layer caches (bf16, 16 / 8 heads, head_dim 128, block 16, longest first), CUDA events, median of 7;
then the same batch sizes with uniform contexts of 512 and 4,096 tokens (other workloads).

    python3 perf/calls/s8_split_sweep.py          # call 3: events around eager launches (host-bound at small batches)
    python3 perf/calls/s8_split_sweep.py --spin   # call 6: the GPU spins while the host enqueues (device time)
"""

from __future__ import annotations

import statistics
import sys

import torch

sys.path.insert(0, ".")
from nanovllm_ref.attention.metadata import decode_batch_bucket  # noqa: E402
from nanovllm_ref.kernels import decode_attention as da  # noqa: E402
from perf.device import time_fn  # noqa: E402
from perf.workloads import decode_contexts, headline  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS, COPIES = 16, 8, 128, 16, 28, 4
MAX_MODEL_LEN = 4096
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)


def setup(ctx: list[int], dev: str) -> dict:
    g = torch.Generator(device=dev).manual_seed(len(ctx))
    blocks = [-(-n // BLOCK) for n in ctx]
    shape = (sum(blocks), BLOCK, KV_HEADS, HEAD_DIM)
    caches = [(torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g),
               torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g)) for _ in range(COPIES)]
    perm = torch.randperm(sum(blocks), device=dev, generator=g).to(torch.int32)
    tables = torch.zeros(len(ctx), MAX_MODEL_LEN // BLOCK, dtype=torch.int32, device=dev)
    start = 0
    for i, b in enumerate(blocks):
        tables[i, :b] = perm[start:start + b]
        start += b
    seq_lens = torch.tensor(ctx, dtype=torch.int32, device=dev)
    q = torch.randn(len(ctx), HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=g)
    return dict(caches=caches, tables=tables, seq_lens=seq_lens, q=q, out=torch.empty_like(q),
                order=torch.argsort(seq_lens, descending=True, stable=True).to(torch.int32),
                ws=torch.empty(da.decode_workspace_numel(len(ctx), HEADS, HEAD_DIM, 64), device=dev))


def run(b: dict, splits: int | None) -> None:
    for layer in range(LAYERS):
        k, v = b["caches"][layer % COPIES]
        da.decode_attention(b["q"], k, v, b["tables"], b["seq_lens"], HEAD_DIM**-0.5, max_seq_len=MAX_MODEL_LEN,
                            split_batch=decode_batch_bucket(len(b["seq_lens"])), num_splits=splits,
                            order=b["order"], out=b["out"], workspace=b["ws"])


def per_layer_us(b: dict, splits: int | None) -> float:
    if "--spin" in sys.argv:  # call 6: a spin kernel ahead of the window hides the host's launches (perf/device.py)
        return statistics.median(time_fn(lambda: run(b, splits), 7, "cuda", warmup=2)) * 1e6 / LAYERS
    run(b, splits)
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run(b, splits)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / LAYERS)
    return statistics.median(times)


def main() -> None:
    dev, w = "cuda", headline()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    running = [len(decode_contexts(w, s)) for s in range(1024)]
    print(f"{sms} SMs; us per layer; splits: heuristic, " + ", ".join(map(str, SPLITS)), flush=True)
    for kind in ("headline", "uniform512", "uniform4096"):
        for batch in (1, 4, 8, 12, 16, 19, 24, 32, 40, 48, 56, 64, 80, 96, 128):
            if kind == "headline":
                step = max(s for s in range(1024) if running[s] >= batch)
                ctx = decode_contexts(w, step)[:batch]
            else:
                ctx = [int(kind[7:])] * batch
            b = setup(ctx, dev)
            heur = da.decode_num_splits(decode_batch_bucket(batch), KV_HEADS, MAX_MODEL_LEN, 64, sms)
            row = [per_layer_us(b, None)] + [per_layer_us(b, s) for s in SPLITS]
            best = SPLITS[min(range(len(SPLITS)), key=lambda i: row[1 + i])]
            print(f"{kind} b{batch} ctx {min(ctx)}-{max(ctx)}: heuristic({heur}) {row[0]:.1f} | "
                  + " ".join(f"{s}:{t:.1f}" for s, t in zip(SPLITS, row[1:])) + f" | best {best}", flush=True)
            del b
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
