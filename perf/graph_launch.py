"""GPU: how long a decode step's CUDA graph waits on the device before its first kernel, and what its launch costs
the host, after each kind of op that may precede it (its input copies, a kernel, a host-to-device copy).

Builds the engine (random weights), stages one decode step of 256 sequences (random contexts of 200-1,100 tokens) and
replays the graph 20 times per variant under the torch profiler, after a 0.1 s spin kernel so that the host is ahead
and every replay is queued (the device's own latency, not the host's). For comparison a 20-kernel graph. From the
trace: per replay the gap between the op before it and its first kernel, the `cudaGraphLaunch` call's host time, the
mean gap between the graph's own kernels.

    python -m perf.graph_launch --kv-cache-dtype fp8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
from collections.abc import Callable

import torch


def graph_gaps(events: list[dict]) -> dict:
    """From a Chrome trace's events: the device gaps before each graph launch's first op (median, min, max), the ops
    before them, the median host time of the launch call, and the mean gap between one launch's consecutive ops."""
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e["dur"] for e in events
                if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", "")}
    corr = [e.get("args", {}).get("correlation") for e in gpu]
    before, inner, prev_ops = [], [], set()
    for i in range(1, len(gpu)):
        gap = gpu[i]["ts"] - gpu[i - 1]["ts"] - gpu[i - 1]["dur"]
        if corr[i] in launches and corr[i] == corr[i - 1]:
            inner.append(gap)
        elif corr[i] in launches:
            before.append(gap)
            prev_ops.add(gpu[i - 1]["name"][:48])
    return {"gap_before_us": (statistics.median(before), min(before), max(before)) if before else None,
            "after": sorted(prev_ops), "host_launch_us": statistics.median(launches.values()) if launches else None,
            "inner_gap_us": statistics.fmean(inner) if inner else None}


def profile(fn: Callable[[], None], reps: int = 20) -> dict:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(200_000_000)  # ~0.1 s: the host gets ahead, so every replay below is queued
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(os.path.join(d, "trace.json"))
        with open(os.path.join(d, "trace.json")) as f:
            return graph_gaps(json.load(f)["traceEvents"])


def decode_inputs(runner, n: int = 256) -> tuple:
    """(input ids, positions, AttentionMetadata) of one decode step of n sequences on disjoint blocks."""
    from nanovllm_ref.attention import AttentionMetadata

    rng, bs = random.Random(0), runner.block_size
    lens = [rng.randint(200, 1100) for _ in range(n)]
    tables = torch.zeros(n, -(-max(lens) // bs), dtype=torch.int32)
    first = 0
    for i, length in enumerate(lens):
        blocks = -(-length // bs)
        tables[i, :blocks] = torch.arange(first, first + blocks)
        first += blocks
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    slots = torch.tensor([int(tables[i, (n_ - 1) // bs]) * bs + (n_ - 1) % bs for i, n_ in enumerate(lens)])
    meta = AttentionMetadata(
        slot_mapping=slots.cuda(), query_start_loc=torch.arange(n + 1, dtype=torch.int32, device="cuda"),
        seq_lens=seq_lens.cuda(), block_tables=tables.cuda(), max_query_len=1, max_seq_len=runner.spec.max_model_len,
        decode_order=torch.argsort(-seq_lens.long(), stable=True).cuda())
    return torch.randint(0, 1000, (n,), device="cuda"), (seq_lens - 1).long().cuda(), meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen3-0.6b")
    ap.add_argument("--kv-cache-dtype", default="auto")
    args = ap.parse_args()
    from nanovllm_ref.attention.metadata import decode_batch_bucket
    from nanovllm_ref.testing.bench.runner import build_llm

    runner = build_llm(args.arch, kv_cache_dtype=args.kv_cache_dtype).engine.runner
    graphs, (ids, positions, meta) = runner.graphs, decode_inputs(runner)
    graph = graphs.graphs[decode_batch_bucket(len(ids))]  # the one graphs.run replays
    pinned, staging = torch.zeros(4096, dtype=torch.int64, pin_memory=True), torch.empty(4096, dtype=torch.int64,
                                                                                          device="cuda")
    x = torch.zeros(1024, device="cuda")
    small = torch.cuda.CUDAGraph()
    with torch.cuda.graph(small):
        for _ in range(20):
            x.add_(1)
    variants = {
        "the engine's replay (its input copies first)": lambda: graphs.run(ids, positions, meta),
        "replay alone, back to back": graph.replay,
        "after one device-to-device copy": lambda: (graphs.input_ids[: len(ids)].copy_(ids), graph.replay()),
        "after a kernel": lambda: (graphs.input_ids[: len(ids)].add_(0), graph.replay()),
        "after a host-to-device copy": lambda: (staging.copy_(pinned, non_blocking=True), graph.replay()),
        "a 20-kernel graph after a kernel": lambda: (x.add_(0), small.replay()),
    }
    with torch.inference_mode():
        for name, fn in variants.items():
            fn()
            torch.cuda.synchronize()
            r = profile(fn)
            med, lo, hi = r["gap_before_us"]
            print(f"{name}: gap before the graph {med:.1f} us ({lo:.1f}-{hi:.1f}) after {', '.join(r['after'])}; "
                  f"cudaGraphLaunch {r['host_launch_us']:.0f} us of host; gaps inside {r['inner_gap_us']:.2f} us",
                  flush=True)


if __name__ == "__main__":
    main()
