"""Where in the headline run the GPU idles and what it runs: `python -m perf.idle_timeline [--sync-scheduling]
[--kv-cache-dtype fp8]` (needs CUDA).

One greedy headline run (after an unprofiled one) under the torch profiler, CUDA activity only: every kernel and
copy, also inside CUDA-graph replays. The run is cut into 20 equal windows of device time; for each, the share of
time some kernel or copy ran (the union of their intervals) and the running sequences then (from the host's step
log, mapped onto the device timeline by the first and last kernel). Also the busy share of the whole run and its
idle time: what host work not hidden behind the device costs the workload. Last, the run's kernel time by class
(perf/step_trace.py's names; the LM head and sampler count as GEMMs / other here) in prefill (up to the step after
the first one that leaves nothing waiting: a prompt's last chunk may run in it) and in decode, with each class's
share of the run's wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time

import torch

from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.runner import build_llm, run_throughput, warmup

from .step_trace import classify

WINDOWS = 20


def busy_intervals(events: list[dict]) -> list[tuple[float, float]]:
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def kernel_classes(events: list[dict]) -> list[tuple[float, float, str]]:
    return [(e["ts"], e["dur"], classify(e.get("name", ""), [])) for e in events
            if e.get("cat") == "kernel" and "dur" in e]


def print_classes(kernels: list[tuple[float, float, str]], split: float, wall_s: float) -> None:
    """Kernel time per class before and after `split` (device time, us), against the run's wall time."""
    table: dict[str, list[float]] = {}
    for ts, dur, cls in kernels:
        table.setdefault(cls, [0.0, 0.0])[ts >= split] += dur
    print("| kernel class | prefill steps (ms) | decode steps (ms) | share of the run's wall time |")
    print("| --- | --- | --- | --- |")
    for cls, (a, b) in sorted(table.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {cls} | {a / 1e3:.1f} | {b / 1e3:.1f} | {(a + b) / 1e6 / wall_s:.1%} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sync-scheduling", action="store_true", help="the plain loop instead of async scheduling")
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto (the model dtype) or fp8")
    args = ap.parse_args(argv)
    llm = build_llm("qwen3-0.6b", async_scheduling=not args.sync_scheduling, kv_cache_dtype=args.kv_cache_dtype)
    warmup(llm)
    work = dataclasses.replace(workloads.headline(), temperature=0.0)
    run_throughput(llm, work)  # warm: the profiled run is the second
    log: list[tuple[float, int, int]] = []
    engine = llm.engine
    step = engine.step

    def logged_step():
        out = step()
        log.append((time.perf_counter(), len(engine.scheduler.running), len(engine.scheduler.waiting)))
        return out

    engine.step = logged_step
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        res = run_throughput(llm, work)
    engine.step = step
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = busy_intervals(events)
    t0, t1 = spans[0][0], spans[-1][1]
    busy = sum(b - a for a, b in spans)
    print(f"profiled run: {res.wall_s:.3f} s wall, {res.output_tokens / res.wall_s:,.0f} tok/s, {res.steps} steps; "
          f"device span {(t1 - t0) / 1e6:.3f} s, busy {busy / 1e6:.3f} s ({busy / (t1 - t0):.1%}), "
          f"idle {(t1 - t0 - busy) / 1e3:.1f} ms")
    h0, h1 = log[0][0], log[-1][0]
    print("| window | device ms | busy | idle ms | running seqs (host log) | steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    width = (t1 - t0) / WINDOWS
    for w in range(WINDOWS):
        a, b = t0 + w * width, t0 + (w + 1) * width
        on = sum(max(0.0, min(b, e) - max(a, s)) for s, e in spans if e > a and s < b)
        ha, hb = h0 + (h1 - h0) * w / WINDOWS, h0 + (h1 - h0) * (w + 1) / WINDOWS
        running = [n for t, n, _ in log if ha <= t < hb]
        rng = f"{max(running)}-{min(running)}" if running else "-"
        print(f"| {w} | {width / 1e3:.0f} | {on / width:.1%} | {(width - on) / 1e3:.1f} | {rng} | {len(running)} |")
    # on the device timeline, the end of the step after the first one that left nothing waiting
    drained = next((i for i, (_, _, waiting) in enumerate(log) if waiting == 0), len(log) - 1)
    end = log[min(drained + 1, len(log) - 1)][0]
    split = t0 + (t1 - t0) * (end - h0) / max(h1 - h0, 1e-9)
    print_classes(kernel_classes(events), split, res.wall_s)


if __name__ == "__main__":
    main()
