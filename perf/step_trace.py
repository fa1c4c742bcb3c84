"""Attribution of a profiled engine run: kernels to steps and classes, each step's period split into parts.

Reads a Kineto (torch.profiler) chrome trace: each kernel or copy is given to the step whose host call launched it
(its correlation id -> the runtime/driver launch -> the innermost `record_function` ranges around that launch),
classed by kernel name (the LM head and sampler by their host range), and each step's device period (its first
kernel to the next step's first kernel) is split into those classes, the gaps inside the step and the idle
before the next one. Used by perf/profile_step.py; lower bounds per part from the measured ceilings.
"""

from __future__ import annotations

import collections
from typing import Any

from nanovllm_ref.testing.bench.models import ModelShape

# (class, substrings of the kernel name), first match wins; GEMMs are cuBLAS / CUTLASS names
KERNEL_CLASSES = [
    ("attention", ("_decode_split", "_decode_reduce", "_prefill_kernel", "flash", "fmha", "attention")),
    ("qk-norm+rope+kv", ("_qkv_epilogue",)),
    ("kv store", ("_store_kv",)),
    ("norms", ("_rms_norm",)),
    ("rope", ("_rotary",)),
    ("activation", ("_silu",)),
    ("moe", ("_moe",)),
    ("all-reduce", ("nccl",)),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas", "splitkreduce")),
]
RANGE_CLASSES = ("lm_head", "sampler")  # by the host range of the launch (their kernels are GEMMs / Triton)
STEP_PREFIX = "nvr_step#"


def classify(name: str, ranges: list[str]) -> str:
    for r in reversed(ranges):  # the innermost named range wins
        if r in RANGE_CLASSES:
            return r
    low = name.lower()
    for cls, keys in KERNEL_CLASSES:
        if any(k.lower() in low for k in keys):
            return cls
    return "other"


def kernels_by_step(trace: dict[str, Any]) -> dict[int, list[tuple[float, float, str, str]]]:
    """step index -> [(start us, end us, class, kernel name)] of the device work its host call launched."""
    events = trace["traceEvents"]
    ranges = sorted((e["ts"], e["ts"] + e["dur"], e["name"], e.get("tid")) for e in events
                    if e.get("cat") == "user_annotation" and e.get("ph") == "X")
    launch_ts = {e["args"]["correlation"]: (e["ts"], e.get("tid")) for e in events
                 if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out: dict[int, list[tuple[float, float, str, str]]] = collections.defaultdict(list)
    for e in events:
        cat = e.get("cat")
        if cat not in ("kernel", "gpu_memcpy", "gpu_memset") or e.get("ph") != "X":
            continue
        ts, tid = launch_ts.get(e.get("args", {}).get("correlation"), (None, None))
        if ts is None:
            continue
        names = [n for a, b, n, t in ranges if a <= ts <= b and t == tid]
        step = next((int(n[len(STEP_PREFIX):]) for n in names if n.startswith(STEP_PREFIX)), None)
        if step is None:
            continue
        cls = "copies" if cat != "kernel" else classify(e["name"], names)
        out[step].append((e["ts"], e["ts"] + e["dur"], cls, e["name"]))
    return out


def breakdown(kernels: dict[int, list], steps: list[int]) -> dict[str, float]:
    """Mean us per step of each class, of the gaps inside the steps and of the idle between them, over `steps`
    (each needs the next step's kernels: its period ends where the next step's device work begins)."""
    totals: dict[str, float] = collections.defaultdict(float)
    used = 0
    for i in steps:
        ks, nxt = sorted(kernels.get(i, [])), kernels.get(i + 1)
        if not ks or not nxt:
            continue
        used += 1
        end = ks[0][0]
        for a, b, cls, _ in ks:  # one stream: overlaps are rare; count each instant once
            a = max(a, end)
            totals["gaps inside the step"] += max(0.0, a - end)
            totals[cls] += max(0.0, b - a)
            end = max(end, b)
        totals["idle between steps (host)"] += max(0.0, min(k[0] for k in nxt) - end)
        totals["period"] += min(k[0] for k in nxt) - ks[0][0]
    return {k: v / max(used, 1) for k, v in totals.items()} | {"steps": used}


def top_kernels(kernels: dict[int, list], steps: list[int], k: int = 12) -> list[tuple[str, float, float]]:
    """The `k` kernels with the most device time: (name, launches per step, us per step)."""
    count: dict[str, int] = collections.Counter()
    time_us: dict[str, float] = collections.defaultdict(float)
    for i in steps:
        for a, b, _, name in kernels.get(i, []):
            count[name] += 1
            time_us[name] += b - a
    n = max(len(steps), 1)
    return [(name[:90], count[name] / n, us / n) for name, us in sorted(time_us.items(), key=lambda kv: -kv[1])[:k]]


def top_gaps(kernels: dict[int, list], steps: list[int], k: int = 8) -> list[tuple[str, float, float]]:
    """Where the device idles inside the steps: ("previous -> next kernel", times per step, us per step)."""
    count: dict[str, int] = collections.Counter()
    time_us: dict[str, float] = collections.defaultdict(float)
    for i in steps:
        ks = sorted(kernels.get(i, []))
        for (_, end, _, prev), (start, _, _, name) in zip(ks, ks[1:]):
            if start > end:
                key = f"{prev[:40]} -> {name[:40]}"
                count[key] += 1
                time_us[key] += start - end
    n = max(len(steps), 1)
    return [(key, count[key] / n, us / n) for key, us in sorted(time_us.items(), key=lambda kv: -kv[1])[:k]]


def decode_bounds(shape: ModelShape, batch: int, context: int, copy_gbps: float, kv_bytes: int = 2) -> dict[str, float]:
    """Lower bounds (us) of a decode step's parts at the copy bandwidth: weights and the KV cache (`kv_bytes` per
    element) read once."""
    bw = copy_gbps * 1e3  # bytes per us
    lm = shape.vocab_size * shape.hidden_size * 2
    return {"gemm": shape.num_layers * shape.layer_linear_params * 2 / bw, "lm_head": lm / bw,
            "attention": context * shape.kv_bytes_per_token(kv_bytes) / bw,
            "kv store": batch * shape.kv_bytes_per_token(kv_bytes) / bw}


def prefill_bounds(shape: ModelShape, tokens: int, pairs: int, tflops: float) -> dict[str, float]:
    rate = tflops * 1e6  # FLOPs per us
    return {"gemm": tokens * shape.linear_flops_per_token() / rate, "attention": shape.attention_flops(pairs) / rate}
