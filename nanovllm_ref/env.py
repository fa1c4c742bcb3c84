"""The one place that reads the process environment and probes the device: environment variables and the GPU's
capabilities, for the resolved plan (config.resolve_spec) and as the defaults of kernel wrappers that tests and the
conformance kernel module call directly (their callers in the engine pass the plan's values).

Each function reads the variable when it is called (tests set them with monkeypatch); device probes are cached per
device. Nothing under layers/, models/, kernels/ or attention/ reads the environment or branches on a tensor's device
itself (tests/test_dispatch_once.py): they ask here, or take the decision as a parameter.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads with the engine, not with the CLI's argument checks
    import torch


def triton_interpret() -> bool:
    """TRITON_INTERPRET=1: Triton kernels run in its interpreter, on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def slow_kernels() -> bool:
    """NANOVLLM_REF_SLOW_KERNELS=1: the decode kernel's deliberately slow tiles (the perf gate's demo regression)."""
    return os.environ.get("NANOVLLM_REF_SLOW_KERNELS", "0") == "1"


def gluon_enabled() -> bool:
    """The Gluon fp8 decode kernel unless NANOVLLM_REF_GLUON=0 or the slow kernels are asked for."""
    return os.environ.get("NANOVLLM_REF_GLUON", "1") != "0" and not slow_kernels()


def omp_num_threads() -> int:
    """OMP_NUM_THREADS, 0 when unset or empty."""
    return int(os.environ.get("OMP_NUM_THREADS") or 0)


def on_gpu(device: torch.device) -> bool:
    """Whether `device` is a CUDA GPU."""
    return device.type == "cuda"


def upcast_dots(device: torch.device) -> bool:
    """True when the kernels run in the Triton interpreter (CPU tensors): its `tl.dot` mishandles bfloat16
    (bf16 is stored as uint16 in numpy), so operands are upcast to float32 there. On GPU the tensor cores take
    16-bit operands directly."""
    return not on_gpu(device) or triton_interpret()


@functools.cache
def native_e4m3(device: torch.device) -> bool:
    """True on a CUDA GPU whose PTX has `cvt.rn.f16x2.e4m3x2` (compute capability 8.9+: Ada, Hopper and later)."""
    import torch

    return on_gpu(device) and torch.cuda.get_device_capability(device) >= (8, 9)


@functools.cache
def hopper(device: torch.device) -> bool:
    """True on a CUDA GPU of compute capability 9.0 (H100, H200)."""
    import torch

    return on_gpu(device) and torch.cuda.get_device_capability(device) == (9, 0)


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of the device (a host-side property query, once per device: no sync); 8 off-GPU."""
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count if on_gpu(device) else 8


def gluon_fp8_default(device: torch.device) -> bool:
    """The default of `decode_attention(use_gluon=...)`: an sm_90 GPU, the Gluon kernel not turned off."""
    return on_gpu(device) and hopper(device) and gluon_enabled()
