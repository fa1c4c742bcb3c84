"""Where a CPU engine step spends its time, on the CPU benchmark's workload (perf/bench_cpu.py).

    python -m perf.profile_cpu                       # sdpa backend (the CPU default)
    python -m perf.profile_cpu --backend torch       # the pure-torch reference backend, for comparison

Two views of one `generate` of the workload (after a warm-up, prefix cache emptied):
1. cProfile, grouped into the engine's parts (inclusive time, so parts nest: attention is inside the forward):
   model forward, attention backend (and its KV store), the rest of the layers, sampling, logprobs, scheduling +
   bookkeeping, step input preparation, detokenization.
2. torch.profiler: the torch ops with the most self CPU time (what the Python above calls into).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from pathlib import Path

# (label, file suffix, function name): inclusive time of each; the first match per entry is used
PARTS = (
    ("step (everything)", "engine/llm_engine.py", "step"),
    ("model forward", "engine/model_runner.py", "compute_hidden"),
    ("  attention layer (store + attend)", "layers/attention.py", "forward"),
    ("    attention backend: attend", "_backend.py", "forward"),
    ("    attention backend: store_kv", "_backend.py", "store_kv"),
    ("  q/k norm + RoPE (CPU path)", "kernels/qkv_epilogue.py", "qkv_norm_rope_reference"),
    ("  rotary embedding", "kernels/rotary.py", "rotate"),
    ("  RMSNorm (hidden, q and k)", "kernels/rmsnorm.py", "rms_norm_reference"),
    ("  MLP activation", "kernels/activation.py", "silu_and_mul_reference"),
    ("  linear layers", "torch._C._nn", "linear"),
    ("LM head (compute_logits)", "models/qwen3.py", "compute_logits"),
    ("sampling (on device)", "engine/model_runner.py", "_sample_on_device"),
    ("collect: tokens + logprobs", "engine/model_runner.py", "collect"),
    ("scheduler.schedule", "engine/scheduler.py", "schedule"),
    ("scheduler.update", "engine/scheduler.py", "update"),
    ("prepare_step", "engine/inputs.py", "prepare_step"),
    ("attention metadata tensors", "engine/model_runner.py", "metadata"),
    ("detokenize", "detokenize", ""),
)


def part_times(stats: pstats.Stats) -> list[tuple[str, float, int]]:
    rows = []
    for label, where, name in PARTS:
        total, calls = 0.0, 0
        for (path, _line, func), (_cc, nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            if where in path and (func == name or (not name and where in func)):
                total, calls = total + ct, calls + nc
            elif where == "torch._C._nn" and func == "<built-in method torch._C._nn.linear>":
                total, calls = total + ct, calls + nc
        rows.append((label, total, calls))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-gqa4")
    p.add_argument("--backend", default="auto")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch

    from nanovllm_ref import LLM, SamplingParams

    from .bench_cpu import cpu_workload, model_path

    path = model_path(args.model)
    w = cpu_workload(json.loads((Path(path) / "config.json").read_text())["vocab_size"])
    llm = LLM(path, device="cpu", dtype="float32", cpu_threads=args.threads, attention_backend=args.backend)
    params = SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True)
    llm.generate(w.prompts, params, use_tqdm=False)  # warm-up
    llm.reset_prefix_cache()
    t0 = time.perf_counter()
    llm.generate(w.prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    llm.reset_prefix_cache()
    prof = cProfile.Profile()
    prof.runcall(llm.generate, w.prompts, params, use_tqdm=False)
    stats = pstats.Stats(prof)
    print(f"{args.model} float32, workload {w.name}, backend {llm.engine.spec.backend}, {args.threads} thread(s), "
          f"load average {os.getloadavg()[0]:.2f}: generate {wall:.3f} s unprofiled = "
          f"{w.output_tokens / wall:,.0f} output tok/s; profiled {stats.total_tt:.3f} s")  # type: ignore[attr-defined]
    print(f"{'part (cProfile, inclusive)':40s} {'seconds':>8s} {'share':>6s} {'calls':>7s}")
    for label, seconds, calls in part_times(stats):
        print(f"{label:40s} {seconds:8.3f} {seconds / stats.total_tt:6.1%} {calls:7d}")  # type: ignore[attr-defined]
    llm.reset_prefix_cache()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
        llm.generate(w.prompts, params, use_tqdm=False)
    print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=40))
    llm.shutdown()


if __name__ == "__main__":
    main()
