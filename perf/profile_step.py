"""Step-time breakdown of nanovllm_ref: device time per kernel class, gaps, and host time not hidden.

Runs a workload (default: the headline) through the step API twice. Pass 1 times, without the profiler, the
first steps (pure and mixed prefill) one by one and a window of steady decode steps at full batch (wall time
between device synchronizes, divided by the steps; no synchronize inside the window, so async scheduling runs
as in production). Pass 2 replays the same steps under the torch profiler
(CUPTI: every kernel, also inside CUDA-graph replays) and splits each step's period on the device into:
- device time of each kernel class (attention, GEMMs, norms, RoPE, KV store, activation, LM head, sampler,
  all-reduce, copies, other), from kernel names; the LM head and the sampler from the host range their launch
  was made in (`record_function` around `compute_logits` / `sample`);
- gaps between the step's kernels (idle inside its span: launch gaps, the host catching up mid-step);
- idle between steps: the device waiting for the host (host time not hidden behind the device).
The parts add up to the profiled period exactly; the report shows it against the unprofiled step, and each
part's lower bound from the measured ceilings (bytes / copy bandwidth in decode, FLOPs / matmul rate in prefill).
Kernels are attributed to the step whose host call launched them (async scheduling launches step t+1 during
call t); the attribution is perf/step_trace.py. References: torch.profiler / Kineto trace format; vLLM's
`benchmarks/` profiling; nsys's method.

    python3 -m perf.profile_step --arch qwen3-0.6b --temperature 0 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.device import has_cuda, measure_ceilings, sync
from nanovllm_ref.testing.bench.models import ModelShape, model_folder, read_config
from nanovllm_ref.testing.bench.roofline import causal_pairs, roofline
from nanovllm_ref.testing.bench.runner import build_llm, params_for, reset_prefix_cache, run_throughput, warmup

from .step_trace import STEP_PREFIX, breakdown, decode_bounds, kernels_by_step, prefill_bounds, top_gaps, top_kernels

PHASE_LABELS = {"launch": "launch (all of the next step's launches)",
                "compute_hidden": "  of it: compute_hidden (graph inputs + replay)",
                "compute_logits": "  of it: compute_logits (LM head)", "_sample_on_device": "  of it: sampler",
                "_apply": "_apply (scheduler.update)"}


def _instrument(llm: Any) -> Callable[[], None]:
    """Named host ranges around the LM head and the sampler (instance / module attributes, nothing else);
    returns the function that takes them away again."""
    from nanovllm_ref.engine import model_runner

    runner = llm.engine.runner
    model, original_logits = runner.model, runner.model.compute_logits

    def compute_logits(hidden: torch.Tensor) -> Any:
        with torch.profiler.record_function("lm_head"):
            return original_logits(hidden)

    model.compute_logits = compute_logits
    if not hasattr(model_runner, "_unwrapped_sample"):
        model_runner._unwrapped_sample = model_runner.sample

        def sample(*args: Any, **kwargs: Any) -> torch.Tensor:
            with torch.profiler.record_function("sampler"):
                return model_runner._unwrapped_sample(*args, **kwargs)

        model_runner.sample = sample

    def restore() -> None:
        model.__dict__.pop("compute_logits", None)
        model_runner.sample = model_runner.__dict__.pop("_unwrapped_sample", model_runner.sample)

    return restore


def _record_schedules(llm: Any) -> list[dict[str, int]]:
    """Wrap the scheduler (instance attribute) to log each general step: tokens, sequences, attention pairs."""
    scheduler, log = llm.engine.scheduler, []
    original = type(scheduler).schedule

    def schedule() -> Any:
        out = original(scheduler)
        pairs = sum(causal_pairs(n, seq.num_computed_tokens + n) for seq, n in out.scheduled)
        log.append({"tokens": out.num_batched_tokens, "seqs": len(out.scheduled), "pairs": pairs})
        return out

    scheduler.schedule = schedule
    return log


class HostPhases:
    """Host time per phase of the engine loop (perf_counter around instance / module attributes): where a step's
    host time goes, and how long the host waits for the device in `collect` (~0 when the host is the bottleneck)."""

    def __init__(self, llm: Any) -> None:
        from nanovllm_ref.engine import llm_engine, overlap

        self.totals: dict[str, float] = collections.defaultdict(float)
        self.active = False
        engine, runner = llm.engine, llm.engine.runner
        self._undo = []
        for name, owner in (("_schedule", engine.scheduler), ("launch", runner),
                            ("compute_hidden", runner), ("compute_logits", runner.model),
                            ("_sample_on_device", runner), ("_apply", engine), ("prepare_step", llm_engine),
                            ("prepare_step", overlap)):
            self._wrap(owner, name)
        original_collect = runner.collect

        def collect(launched: Any) -> Any:
            t0 = time.perf_counter()
            if launched.done is not None:
                launched.done.synchronize()
            t1 = time.perf_counter()
            out = original_collect(launched)
            if self.active:
                self.totals["collect: wait for the device"] += t1 - t0
                self.totals["collect: rest"] += time.perf_counter() - t1
            return out

        runner.collect = collect
        self._undo.append(lambda: runner.__dict__.pop("collect", None))

    def _wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if self.active:
                    self.totals[name] += time.perf_counter() - t0

        own = name in vars(owner)  # a module's function, or an instance attribute set before (e.g. _instrument's)
        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original) if own else vars(owner).pop(name, None))

    def restore(self) -> None:
        for undo in reversed(self._undo):
            undo()

    def per_step_us(self, steps: int) -> dict[str, float]:
        return {k: 1e6 * v / max(steps, 1) for k, v in self.totals.items()}


def _step_info(llm: Any) -> dict[str, int]:
    """What is running now: sequences, waiting ones, total context (for the decode bounds)."""
    running = llm.engine.scheduler.running
    return {"running": len(running), "waiting": len(llm.engine.scheduler.waiting),
            "context": sum(s.num_tokens for s in running)}


def run_pass(llm: Any, w: workloads.Workload, first: int, skip: int, window: int, profile: bool,
             phases: HostPhases | None = None) -> dict[str, Any]:
    """Add the workload, step `first` steps (each timed), `skip` more, then `window` decode steps (timed as one)."""
    reset_prefix_cache(llm)
    engine, dev = llm.engine, llm.engine.spec.device
    ids = [engine.add_request(p, sp) for p, sp in zip(w.prompts, params_for(w))]
    log = _record_schedules(llm)
    prof = None
    if profile:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        prof = torch.profiler.profile(activities=acts)
        prof.__enter__()
    steps = []
    for i in range(first + skip + window):
        timed = i < first  # the first steps one by one (synchronized); later ones run as the engine runs them
        info = _step_info(llm) if timed or i == first + skip else {}
        if timed:
            sync(dev)
        t0 = time.perf_counter()
        with torch.profiler.record_function(f"{STEP_PREFIX}{i}"):
            engine.step()
        if timed:
            sync(dev)
            # the i-th step that ran is the i-th one scheduled (async scheduling schedules the next one during a
            # step: the log's last entry may be that one; a schedule-ahead that found nothing to run is dropped)
            info.update([e for e in log if e["seqs"]][i])
        key = "wall_ms" if timed else "host_ms"  # a step launched ahead returns before its device work ends
        steps.append({"index": i, key: 1e3 * (time.perf_counter() - t0), **info})
        if i == first + skip - 1:  # the decode window is timed as a whole: no syncs inside it
            sync(dev)
            t_window = time.perf_counter()
            if phases is not None:
                phases.active = True
    sync(dev)
    if phases is not None:
        phases.active = False
    window_ms = 1e3 * (time.perf_counter() - t_window) / window
    for rid in ids:
        engine.abort_request(rid)
    sync(dev)
    engine.scheduler.__dict__.pop("schedule", None)
    trace = None
    if prof is not None:
        prof.__exit__(None, None, None)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
    return {"steps": steps, "window_ms": window_ms, "trace": trace}


def print_details(kernels: dict[int, list], steps: list[int]) -> dict[str, list]:
    details = {"top_kernels": top_kernels(kernels, steps), "top_gaps": top_gaps(kernels, steps)}
    print("| kernel | launches / step | us / step |\n| --- | --- | --- |")
    for name, n, us in details["top_kernels"]:
        print(f"| {name} | {n:.0f} | {us:.1f} |")
    print("| gap (previous -> next) | times / step | us / step |\n| --- | --- | --- |")
    for name, n, us in details["top_gaps"]:
        print(f"| {name} | {n:.1f} | {us:.1f} |")
    return details


def print_table(title: str, parts: dict[str, float], measured_ms: float, bounds: dict[str, float]) -> None:
    period = parts.get("period", 0.0)
    print(f"\n{title}: profiled period {period:.0f} us over {parts.get('steps', 0)} steps; unprofiled "
          f"{1e3 * measured_ms:.0f} us (parts / unprofiled = {period / max(1e3 * measured_ms, 1e-9):.3f})")
    print("| part | us / step | share | lower bound us | bound / part |\n| --- | --- | --- | --- | --- |")
    for name, us in sorted(((k, v) for k, v in parts.items() if k not in ("period", "steps")), key=lambda kv: -kv[1]):
        b = bounds.get(name)
        ratio = f"{b / us:.0%}" if b and us else ""
        print(f"| {name} | {us:.1f} | {us / max(period, 1e-9):.1%} | {f'{b:.1f}' if b else ''} | {ratio} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="qwen3-0.6b")
    p.add_argument("--workload", default="headline")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--prefill-steps", type=int, default=3, help="first steps, profiled one by one")
    p.add_argument("--skip", type=int, default=20, help="steps between those and the decode window")
    p.add_argument("--window", type=int, default=30, help="steady decode steps timed and profiled")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's dtype) or fp8")
    p.add_argument("--throughput", default="", help="also time the whole workload at these temperatures, e.g. 0,0.6")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not has_cuda():
        raise SystemExit("profile_step needs a CUDA GPU (it reads CUPTI kernel timings)")
    w = workloads.get(args.workload)
    if args.temperature is not None:
        w = w.with_temperature(args.temperature)
    shape = ModelShape.from_config(read_config(model_folder(args.arch)))
    ceilings = measure_ceilings("cuda")
    llm = build_llm(args.arch, enforce_eager=args.enforce_eager, kv_cache_dtype=args.kv_cache_dtype)
    warmup(llm)
    restore = _instrument(llm)
    phases = HostPhases(llm)  # host phases are timed in the unprofiled pass only
    plain = run_pass(llm, w, args.prefill_steps, args.skip, args.window, profile=False, phases=phases)
    phases.restore()
    prof = run_pass(llm, w, args.prefill_steps, args.skip, args.window, profile=True)
    kernels = kernels_by_step(prof.pop("trace"))
    report: dict[str, Any] = {"arch": args.arch, "workload": w.name, "temperature": w.temperature,
                              "ceilings": ceilings.as_dict(), "plain": plain, "profiled_steps": prof["steps"]}
    for i in range(args.prefill_steps):
        info = plain["steps"][i]
        parts = breakdown(kernels, [i])
        bounds = prefill_bounds(shape, info["tokens"], info["pairs"], ceilings.matmul_tflops)
        print_table(f"step {i} ({info['tokens']} tokens of {info['seqs']} sequences)", parts, info["wall_ms"], bounds)
        report[f"prefill_step_{i}"] = {"parts": parts, "bounds": bounds, "wall_ms": info["wall_ms"]}
        if i == 0:
            report["prefill_step_0"].update(print_details(kernels, [0]))
    first = args.prefill_steps + args.skip
    window = list(range(first, first + args.window - 1))
    info = prof["steps"][first]
    parts = breakdown(kernels, window)
    kv_bytes = 1 if args.kv_cache_dtype.startswith("fp8") else 2
    bounds = decode_bounds(shape, info["running"], info["context"], ceilings.copy_gbps, kv_bytes)
    print_table(f"steady decode ({info['running']} running, context {info['context']} tokens in all)", parts,
                plain["window_ms"], bounds)
    host = phases.per_step_us(args.window)
    print("| host phase (steady decode, unprofiled) | us / step |\n| --- | --- |")
    for name, us in sorted(host.items(), key=lambda kv: -kv[1]):
        print(f"| {PHASE_LABELS.get(name, name)} | {us:.1f} |")
    report["decode"] = {"host_phases_us": host, "parts": parts, "bounds": bounds, "window_ms": plain["window_ms"],
                        "profiled_window_ms": prof["window_ms"], "info": info, **print_details(kernels, window)}
    restore()
    report["throughput"] = [_throughput(llm, w.with_temperature(float(t)), shape, ceilings)
                            for t in args.throughput.split(",") if t]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    llm.engine.shutdown()
    return 0


def _throughput(llm: Any, w: workloads.Workload, shape: ModelShape, ceilings: Any) -> dict[str, Any]:
    """The whole workload through `generate`, timed as `nanovllm-ref bench` does (same engine, after the passes)."""
    r = run_throughput(llm, w)
    roof = roofline(shape, [len(p) for p in w.prompts], w.output_lens, ceilings, 1, 2,
                    cached_prompt_tokens=r.cached_prompt_tokens)
    out = {**r.as_dict(), "temperature": w.temperature, "roofline_s": roof.seconds,
           "roofline_fraction": roof.seconds / r.wall_s}
    print(f"\n{w.name} t={w.temperature}: {r.output_tok_s:,.0f} output tok/s ({r.wall_s:.2f} s, {r.steps} steps, "
          f"{1e3 * r.wall_s / r.steps:.2f} ms/step), {out['roofline_fraction']:.1%} of the roofline "
          f"({roof.seconds:.2f} s at copy {ceilings.copy_gbps:,.0f} GB/s)", flush=True)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
