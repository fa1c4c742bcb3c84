"""A/B of two trees' CPU path in one process, by process CPU time: this tree against a git revision.

    python -m perf.cpu_ab --base main --rounds 11
    python -m perf.cpu_ab --base main --rounds 11 --lockstep   # the two engines' steps alternate within a round

On a shared machine wall times move with other load, and two runs at different moments are not comparable. Here
both engines live in one process (the base revision's `nanovllm_ref` is exported with `git archive` into a temporary
folder and renamed `nanovllm_base`), run bench_cpu's workload in alternating order round by round, and each
`generate` is timed by `time.process_time` (1 torch thread: the process's CPU time is the step's work, not the
time it waited for a core). Prints both trees' CPU seconds and wall per round, the per-round CPU-time speed-up
with its median, and the medians of the first step (the prompts' prefill) and of the later (decode) steps apart;
the greedy tokens of the two trees must be equal. With `--lockstep` the two engines generate at the same time, a
step each in turn, so a load change between two rounds cannot favour one tree (each step is timed on its own).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .bench_cpu import ROOT, cpu_workload, model_path


def export_base(rev: str, into: Path) -> None:
    """`nanovllm_ref` of `rev` as the package `nanovllm_base` under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "nanovllm_ref"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "nanovllm_ref").rename(into / "nanovllm_base")
    for path in (into / "nanovllm_base").rglob("*.py"):
        path.write_text(path.read_text().replace("nanovllm_ref", "nanovllm_base"))


def generate(llm, prompts: list[list[int]], params) -> float:
    """`llm.generate(prompts)` through the step API; returns the process CPU time when its first step ended."""
    for p in prompts:
        llm.add_request(p, params)
    llm.step()
    first = time.process_time()
    while llm.engine.has_unfinished():
        llm.step()
    return first


def lockstep(engines: dict, prompts: list[list[int]], order: list[str]) -> dict[str, tuple[float, float, float]]:
    """Both engines generate `prompts` at once, one step each in turn (`order` first): a change of load hits both
    within milliseconds. Returns each engine's (CPU time of its first step, of all its steps, wall of its steps)."""
    times = {name: [0.0, 0.0, 0.0] for name in order}
    for name in order:
        llm, params, _ = engines[name]
        llm.reset_prefix_cache()
        for p in prompts:
            llm.add_request(p, params)
    first = True
    while any(engines[name][0].engine.has_unfinished() for name in order):
        for name in order:
            llm = engines[name][0]
            if llm.engine.has_unfinished():
                t0, c0 = time.perf_counter(), time.process_time()
                llm.step()
                cpu, t = times[name], time.process_time() - c0
                cpu[0], cpu[1], cpu[2] = cpu[0] + (t if first else 0.0), cpu[1] + t, cpu[2] + time.perf_counter() - t0
        first = False
    return {name: (a, b, c) for name, (a, b, c) in times.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="main", help="git revision to compare this tree with")
    p.add_argument("--model", default="qwen3-gqa4")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--lockstep", action="store_true",
                   help="run the two engines' steps alternately within each round (less noise under changing load)")
    args = p.parse_args(argv)
    path = model_path(args.model)
    w = cpu_workload(json.loads((Path(path) / "config.json").read_text())["vocab_size"], num_prompts=args.prompts,
                     max_tokens=args.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        export_base(args.base, Path(tmp))
        sys.path.insert(0, tmp)
        engines = {}
        for name, module in (("base", "nanovllm_base"), ("this tree", "nanovllm_ref")):
            mod = importlib.import_module(module)
            llm = mod.LLM(path, device="cpu", dtype="float32", cpu_threads=1)
            final_only = {"output_kind": 2} if "output_kind" in mod.SamplingParams.__dataclass_fields__ else {}
            params = mod.SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True,
                                        **final_only)  # (FINAL_ONLY: step() builds no per-step outputs, as before)
            engines[name] = (llm, params, [o.token_ids for o in llm.generate(w.prompts, params, use_tqdm=False)])
        (_, _, a), (_, _, b) = engines.values()
        if a != b:
            raise SystemExit("the two trees' greedy tokens differ")
        cpu: dict[str, list[float]] = {k: [] for k in engines}
        wall: dict[str, list[float]] = {k: [] for k in engines}
        first: dict[str, list[float]] = {k: [] for k in engines}  # CPU time of the first step (all the prompts)
        for i in range(args.rounds):
            order = list(engines)[:: 1 if i % 2 == 0 else -1]
            if args.lockstep:
                for name, (f, c, t) in lockstep(engines, w.prompts, order).items():
                    first[name].append(f)
                    cpu[name].append(c)
                    wall[name].append(t)
                continue
            for name in order:
                llm, params, _ = engines[name]
                llm.reset_prefix_cache()
                t0, c0 = time.perf_counter(), time.process_time()
                first[name].append(generate(llm, w.prompts, params) - c0)
                cpu[name].append(time.process_time() - c0)
                wall[name].append(time.perf_counter() - t0)
    mode = "rounds, steps in lockstep" if args.lockstep else "alternating rounds"
    print(f"{args.model} float32, workload {w.name}, 1 thread, base {args.base}, {args.rounds} {mode}, "
          f"load average at the end {os.getloadavg()[0]:.2f}; greedy tokens equal")
    for name in engines:
        c, t = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"{name:10s} CPU s {' '.join(f'{x:.3f}' for x in cpu[name])}: median {c:.3f} "
              f"({w.output_tokens / c:,.0f} tok/s of CPU time), min {min(cpu[name]):.3f}; wall median {t:.3f} s")
    for part, times in (("first step", first), ("later steps", {k: [c - f for c, f in zip(cpu[k], first[k])]
                                                                  for k in cpu})):
        (a, b) = (statistics.median(t) for t in times.values())
        print(f"{part:12s} CPU s median: base {a:.3f}, this tree {b:.3f}; speed-up {a / b:.3f}")
    ratios = [x / y for x, y in zip(*cpu.values())]
    print(f"CPU-time speed-up per round {' '.join(f'{r:.2f}' for r in ratios)}: median {statistics.median(ratios):.3f}"
          f"; wall median speed-up {statistics.median(wall['base']) / statistics.median(wall['this tree']):.3f}")


if __name__ == "__main__":
    main()
