"""`nanovllm-ref bench`: engine throughput on a workload and/or TTFT / TPOT latency, against the roofline.

    nanovllm-ref bench --arch qwen3-0.6b --workload headline            # the headline number (GPU)
    nanovllm-ref bench --arch qwen3-8b --workload headline --tp 2
    nanovllm-ref bench --mode latency --latency-batches 1,64
    nanovllm-ref bench --arch tiny --workload smoke --device cpu         # CPU smoke, seconds
    python -m nanovllm_ref.testing.bench ...                            # the same without the console script

Throughput: one warm-up (a few short requests) then `generate` of the whole workload, as nano-vllm's
bench.py (`--repeat N` runs it N times, prefix cache emptied in between, and reports the median). The
roofline is computed from the model shape and the device's measured copy bandwidth and matmul rate
(roofline.py). A progress bar on stderr counts the stages (ceilings, engine, warm-up, each timed run);
the timed runs themselves draw nothing, as nano-vllm's bench runs `generate(use_tqdm=False)`. The result is
written to `--json FILE`, else to `--out DIR` (default: the user cache folder, tables.results_dir()) as
<time>_engine_<arch>_<workload>_tp<N>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from . import workloads
from .device import device_type, machine_info, measure_ceilings
from .models import ARCHS, ModelShape, model_folder, read_config
from .roofline import H200, H200_HEADLINE_ROOFLINE_S, roofline
from .runner import build_llm, run_latency, run_throughput, warmup
from .tables import fmt, results_dir, save_result, text_table

CPU_SMOKE = "nanovllm-ref bench --arch tiny --workload smoke --device cpu"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints the whole usage block too: one line is enough
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="nanovllm-ref bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="qwen3-0.6b", choices=sorted(ARCHS), help="random-weight model shape")
    p.add_argument("--model", default=None, help="a real checkpoint folder (overrides --arch)")
    p.add_argument("--workload", default="headline", choices=sorted(workloads.WORKLOADS))
    p.add_argument("--mode", choices=("throughput", "latency", "all"), default="throughput")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--sync-scheduling", action="store_true", help="async_scheduling=False (A/B against async)")
    p.add_argument("--repeat", type=int, default=1, help="timed runs of the workload (median reported)")
    p.add_argument("--full-warmup", action="store_true", help="also run the whole workload once, untimed")
    p.add_argument("--num-requests", type=int, default=None, help="only the first N requests of the workload")
    p.add_argument("--temperature", type=float, default=None, help="override (nano-vllm's bench uses 0.6)")
    p.add_argument("--penalized-fraction", type=float, default=0.0,
                   help="fraction of requests with repetition/presence/frequency penalties")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the model dtype) | fp8 (1-byte KV, its roofline)")
    p.add_argument("--batch-invariant", action="store_true", help="batch_invariant=True (kernels/matmul.py)")
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size (nano-vllm's default: 256)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--latency-batches", default="1,64")
    p.add_argument("--prompt-len", type=int, default=512, help="latency mode prompt length")
    p.add_argument("--output-len", type=int, default=128, help="latency mode output length")
    p.add_argument("--latency-reps", type=int, default=None, help="default: 10 at batch 1, 3 otherwise")
    p.add_argument("--cpu-threads", type=int, default=1, help="torch threads on the CPU (smoke runs)")
    p.add_argument("--no-ceilings", action="store_true",
                   help="skip measuring; use an H200's (4,250 GB/s copy, 790 TFLOP/s bf16 matmul)")
    p.add_argument("--json", default=None, help="write the result to this file")
    p.add_argument("--out", default=None, help=f"write the result into this folder (default: {results_dir()})")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    _check(p, args)
    return args


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """User mistakes end as one line and exit status 2 (argparse's), before anything is built."""
    if args.model and not os.path.isfile(os.path.join(args.model, "config.json")):
        p.error(f"--model {args.model!r} is not a folder with a config.json")
    for name in ("tp", "repeat", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.num_requests is not None and args.num_requests < 1:
        p.error(f"--num-requests must be >= 1, got {args.num_requests}")
    if not 0 <= args.penalized_fraction <= 1:
        p.error(f"--penalized-fraction must be in [0, 1], got {args.penalized_fraction}")
    if args.device == "cuda" and device_type() == "cpu":
        p.error(f"--device cuda: no CUDA GPU here (on the CPU: `{CPU_SMOKE}`)")
    if args.device is None and args.arch != "tiny" and not args.model and device_type() == "cpu":
        p.error(f"no CUDA GPU here, and --arch {args.arch} (the default workload's model) is a GPU benchmark: "
                f"on the CPU run `{CPU_SMOKE}`")


def _stages(args: argparse.Namespace) -> int:
    """Steps the progress bar counts: ceilings, engine, warm-up, then each timed run and latency batch."""
    runs = (args.repeat + args.full_warmup) if args.mode in ("throughput", "all") else 0
    batches = len(_batches(args)) if args.mode in ("latency", "all") else 0
    return 3 + runs + batches


def _batches(args: argparse.Namespace) -> list[int]:
    return [int(b) for b in args.latency_batches.split(",") if b]


def _step(bar: Any, message: str) -> None:
    """One stage done: its line on stdout (above the bar), the bar one further."""
    bar.write(message)
    bar.update(1)


def _workload(args: argparse.Namespace) -> workloads.Workload:
    w = workloads.get(args.workload)
    if args.num_requests:
        w = w.subset(args.num_requests)
    if args.temperature is not None:
        w = w.with_temperature(args.temperature)
    if args.penalized_fraction:
        w = w.with_penalties(args.penalized_fraction)
    return w


def _throughput(llm: Any, args: argparse.Namespace, shape: ModelShape, ceilings: Any, bar: Any) -> dict[str, Any]:
    w = _workload(args)
    if args.full_warmup:
        r = run_throughput(llm, w)
        _step(bar, f"  full warm-up: {r.wall_s:.2f} s, {r.output_tok_s:,.0f} output tok/s")
    runs = []
    for i in range(args.repeat):
        r = run_throughput(llm, w)
        runs.append(r.as_dict())
        _step(bar, f"  run {i + 1}/{args.repeat}: {r.wall_s:.2f} s, {r.output_tok_s:,.0f} output tok/s, "
                   f"{r.steps} steps, {r.cached_prompt_tokens} cached prompt tokens, {r.preemptions} preemptions")
    median_run = sorted(runs, key=lambda d: d["wall_s"])[len(runs) // 2]  # the median run
    cached = median_run["cached_prompt_tokens"]
    prompt_lens, out_lens = [len(p) for p in w.prompts], w.output_lens
    nbytes = 4 if args.device == "cpu" else 2  # fp32 on the CPU, bf16 on the GPU
    kv_bytes = 1 if args.kv_cache_dtype != "auto" else None
    roof = roofline(shape, prompt_lens, out_lens, ceilings, args.tp, nbytes, cached_prompt_tokens=cached,
                    kv_dtype_bytes=kv_bytes)
    roof_h200 = roofline(shape, prompt_lens, out_lens, H200, args.tp, 2, cached_prompt_tokens=cached)
    out = {
        **median_run, "workload": w.summary(), "runs": runs,
        "wall_s_median": statistics.median(r["wall_s"] for r in runs),
        "roofline": roof.as_dict(), "roofline_fraction": roof.seconds / median_run["wall_s"],
        "roofline_h200": roof_h200.as_dict(), "roofline_h200_fraction": roof_h200.seconds / median_run["wall_s"],
    }
    if w.name == "headline" and args.tp == 1 and args.arch == "qwen3-0.6b" and not args.model:
        out["h200_headline_roofline_s"] = H200_HEADLINE_ROOFLINE_S
    return out


def _latency(llm: Any, args: argparse.Namespace, bar: Any) -> list[dict[str, Any]]:
    rows = []
    for batch in _batches(args):
        reps = args.latency_reps or (10 if batch == 1 else 3)
        s = run_latency(llm, batch, args.prompt_len, args.output_len, reps).summary()
        rows.append(s)
        _step(bar, f"  batch {batch}: TTFT p50 {s['ttft_p50_ms']:.2f} ms p99 {s['ttft_p99_ms']:.2f} ms, "
                   f"TPOT p50 {s['tpot_p50_ms']:.3f} ms p99 {s['tpot_p99_ms']:.3f} ms")
    return rows


def _engine(args: argparse.Namespace, bar: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    llm = _checked(build_llm, args.arch, args.model, device=args.device, tp=args.tp,
                   enforce_eager=args.enforce_eager, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                   max_num_batched_tokens=args.max_num_batched_tokens,
                   gpu_memory_utilization=args.gpu_memory_utilization, kv_cache_dtype=args.kv_cache_dtype,
                   async_scheduling=not args.sync_scheduling, kvcache_block_size=args.block_size,
                   batch_invariant=args.batch_invariant)
    init_s = time.perf_counter() - t0
    _step(bar, f"engine built in {init_s:.1f} s; {llm.engine.block_manager.num_blocks} KV blocks")
    warmup(llm, max_prompt=min(1024, args.max_model_len // 2))
    _step(bar, f"warm-up {time.perf_counter() - t0 - init_s:.1f} s")
    return llm, init_s


class BenchUsageError(Exception):
    """Settings the engine refuses (a cache too small for max_model_len, ...): one line, exit 2."""


def _checked(make: Any, *args: Any, **kwargs: Any) -> Any:
    """``make(...)``; the engine validates its settings before it builds anything, so a ValueError / TypeError is
    the user's to fix."""
    try:
        return make(*args, **kwargs)
    except (ValueError, TypeError) as e:
        raise BenchUsageError(" ".join(str(e).split())) from e


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BenchUsageError as e:
        print(f"nanovllm-ref bench: error: {e}", file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    device = args.device = args.device or device_type()
    if device == "cpu":
        torch.set_num_threads(args.cpu_threads)
    shape = ModelShape.from_config(read_config(model_folder(args.arch, args.model)))
    label = args.model or args.arch
    print(f"nanovllm_ref bench: {label}, tp={args.tp}, device={device}, mode={args.mode}", flush=True)
    with tqdm(total=_stages(args), desc="bench", unit="stage", disable=args.no_progress, file=sys.stderr) as bar:
        ceilings = H200 if args.no_ceilings else measure_ceilings(device)
        _step(bar, f"ceilings ({ceilings.source}): copy {ceilings.copy_gbps:,.0f} GB/s, matmul "
                   f"{ceilings.matmul_tflops:,.3g} TFLOP/s")
        llm, init_s = _engine(args, bar)
        record: dict[str, Any] = {
            "kind": "engine", "engine": "nanovllm_ref", "arch": args.arch, "model": args.model, "tp": args.tp,
            "enforce_eager": args.enforce_eager, "async_scheduling": not args.sync_scheduling, "device": device,
            "machine": machine_info(), "ceilings": ceilings.as_dict(),
            "config": {k: v for k, v in vars(args).items() if k not in ("json", "out")},
            "num_kvcache_blocks": llm.engine.block_manager.num_blocks, "init_s": init_s,
        }
        try:
            if args.mode in ("throughput", "all"):
                record["throughput"] = _throughput(llm, args, shape, ceilings, bar)
            if args.mode in ("latency", "all"):
                record["latency"] = _latency(llm, args, bar)
        finally:
            llm.shutdown()
    _print_summary(record, label)
    if not args.no_save:
        stem = f"engine_{args.arch if not args.model else 'model'}_{args.workload}_tp{args.tp}"
        print(f"saved {save_result(record, args.json, stem, folder=args.out)}")
    return 0


def _print_summary(record: dict[str, Any], label: str) -> None:
    print()
    t = record.get("throughput")
    if t:
        w = t["workload"]
        rows = [
            {"metric": "engine", "value": f"nanovllm_ref {label} tp={record['tp']}"
             + (" eager" if record["enforce_eager"] else "")},
            {"metric": "workload", "value": f"{w['workload']}: {w['requests']} requests, {w['prompt_tokens']:,} "
             f"prompt + {w['output_tokens']:,} output tokens"},
            {"metric": "wall time (s)", "value": t["wall_s"]},
            {"metric": "output tok/s", "value": t["output_tok_s"]},
            {"metric": "total tok/s", "value": t["total_tok_s"]},
            {"metric": "steps", "value": t["steps"]},
            {"metric": "ms / step", "value": t["ms_per_step"]},
            {"metric": "roofline (s), measured ceilings", "value": t["roofline"]["seconds"]},
            {"metric": "roofline output tok/s", "value": t["roofline"]["output_tok_s"]},
            {"metric": "fraction of roofline", "value": f"{100 * t['roofline_fraction']:.1f}%"},
            {"metric": "fraction of H200 roofline", "value": f"{100 * t['roofline_h200_fraction']:.1f}%"},
        ]
        if "h200_headline_roofline_s" in t:
            rows.append({"metric": "H200 roofline of this workload", "value": "3.74 s = 35,800 tok/s"})
        rows = [{"metric": r["metric"], "value": fmt(r["value"])} for r in rows]
        print(text_table(rows, ["metric", "value"]))
    lat = record.get("latency")
    if lat:
        print()
        cols = ["batch", "prompt_len", "output_len", "reps", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
                "tpot_p99_ms", "itl_p99_ms"]
        print(text_table(lat, cols))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
