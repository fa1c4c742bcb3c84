"""The device under test: its name and software versions, its measured ceilings, and timing helpers.

Ceilings (measured once per process, cached):
- copy bandwidth: `dst.copy_(src)` of 4 GiB on the GPU (64 MiB on the CPU), median of 10, counting the
  bytes read plus the bytes written (4.25 TB/s on an H200);
- matmul: bf16 8192^3 `torch.mm` on the GPU (fp32 1024^3 on the CPU), median of 10 (H200: ~790 TFLOP/s).
Timing: CUDA events around the work (GPU) or `time.perf_counter` (CPU), always after a synchronize. On the GPU
a spin kernel (`torch.cuda._sleep`) is queued before the start event, long enough to cover the host's launches:
the work then waits in the queue and the events time the GPU, not Python's launch latency (a 40 us kernel
launched onto an idle GPU otherwise measures ~60 us). nvbench's "blocking kernel" does the same.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable

import torch

from .roofline import Ceilings


def has_cuda() -> bool:
    return torch.cuda.is_available()


def device_type() -> str:
    return "cuda" if has_cuda() else "cpu"


def sync(device: str | torch.device = "cuda") -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def gpu_name() -> str:
    return torch.cuda.get_device_name(0) if has_cuda() else "cpu"


def slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200' (a folder name for per-GPU baselines)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def gpu_slug() -> str:
    """Baseline folder of this machine: 'nvidia-h200', or 'nvidia-h200-x2' on a two-GPU host (TP cases differ)."""
    if not has_cuda():
        return "cpu"
    count = torch.cuda.device_count()
    return slug(gpu_name()) + (f"-x{count}" if count > 1 else "")


@functools.cache
def driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def machine_info() -> dict[str, object]:
    """Static facts of the machine (no measurements: pytest-benchmark compares these between runs)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    info: dict[str, object] = {
        "gpu_name": gpu_name(),
        "gpu_count": torch.cuda.device_count() if has_cuda() else 0,
        "torch_version": torch.__version__,
        "triton_version": triton_version,
        "cuda_version": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
    }
    if has_cuda():
        props = torch.cuda.get_device_properties(0)
        info.update(driver_version=driver_version(), gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    gpu_sm_count=props.multi_processor_count, gpu_capability=f"{props.major}.{props.minor}")
    return info


def spin_gpu(seconds: float, clock_hz: float = 2e9) -> None:
    """Queue a kernel that keeps the GPU busy ~`seconds` (at least: clocks at or below 2 GHz, the H200's 1.98)."""
    torch.cuda._sleep(int(seconds * clock_hz))


def time_fn(fn: Callable[[], object], reps: int, device: str, warmup: int = 2) -> list[float]:
    """Seconds of each of `reps` calls of `fn`: CUDA events on the GPU, perf_counter on the CPU."""
    enqueue_s = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        enqueue_s = time.perf_counter() - t0  # the last warm call: compiled, so ~ the host's launch time
    sync(device)
    times = []
    if torch.device(device).type == "cuda":
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            spin_gpu(2 * enqueue_s + 50e-6)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def _copy_seconds(device: str, nbytes: int, reps: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    return statistics.median(time_fn(lambda: dst.copy_(src), reps, device))


def measure_copy_gbps(device: str, nbytes: int | None = None, reps: int = 10) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read + bytes written."""
    cuda = torch.device(device).type == "cuda"
    nbytes = nbytes or (4 * 2**30 if cuda else 64 * 2**20)
    t = _copy_seconds(device, nbytes, reps)
    if cuda:
        torch.cuda.empty_cache()  # the buffers are gone: give the memory back to the engine that comes next
    return 2 * nbytes / t / 1e9


def _matmul_seconds(device: str, n: int, dtype: torch.dtype, reps: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return statistics.median(time_fn(lambda: torch.mm(a, b, out=out), reps, device, warmup=3))


def measure_matmul_tflops(device: str, n: int | None = None, reps: int = 10) -> float:
    """Dense matmul rate in TFLOP/s: bf16 8192^3 on the GPU, fp32 1024^3 on the CPU."""
    cuda = torch.device(device).type == "cuda"
    n = n or (8192 if cuda else 1024)
    t = _matmul_seconds(device, n, torch.bfloat16 if cuda else torch.float32, reps)
    if cuda:
        torch.cuda.empty_cache()
    return 2 * n**3 / t / 1e12


@functools.cache
def measure_ceilings(device: str | None = None) -> Ceilings:
    """Copy bandwidth and matmul rate of `device` (the current GPU, or the CPU), measured once."""
    device = device or device_type()
    return Ceilings(
        copy_gbps=measure_copy_gbps(device), matmul_tflops=measure_matmul_tflops(device),
        device=gpu_name() if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})",
    )


def percentile(values: list[float], q: float) -> float:
    """q-th percentile (0..100) with linear interpolation; nan for an empty list."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
