"""Engine configuration: the keyword arguments of `LLM(model, **config)` as a frozen, validated dataclass, and
what they resolve to on a checkpoint and a machine (`RunnerSpec`, made once by `resolve_spec`).

An unknown key is a TypeError (nano-vllm silently dropped them); a bad value is a ValueError that names the
field and the limit. Values that depend on the checkpoint or the machine ("auto" device/dtype, the KV cache
size) are resolved into the RunnerSpec, never written back into the Config.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

from .sampling_params import check_bools, check_int

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Config:
    model: str
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    kvcache_block_size: int = 16
    num_kvcache_blocks: int | None = None  # None: sized from the memory budget below
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_gb: float = 2.0  # CPU budget for the KV cache
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    # schedule and launch the next step while the current one runs on the device (steps without logprobs); None: on
    # CUDA, where the host's work then overlaps the GPU's, off on the CPU, where the same cores would do both
    async_scheduling: bool | None = None
    tensor_parallel_size: int = 1
    attention_backend: str = "auto"
    seed: int = 0
    load_format: str = "auto"  # "dummy": random weights, for benchmarks (the folder needs only config.json)
    # torch intra-op threads of a CPU engine (process-wide, set per rank); None: OMP_NUM_THREADS or the usable
    # cores, divided among TP ranks, and at most hidden_size // 256 (tiny models lose time to idle-spinning threads)
    cpu_threads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)):
            raise ValueError(f"model must be a path to a local checkpoint folder, got {self.model!r}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        check_int("max_num_seqs", self.max_num_seqs, 1)
        check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        check_int("max_model_len", self.max_model_len, 1, none_ok=True)
        bs = self.kvcache_block_size
        check_int("kvcache_block_size", bs, 16)
        if bs & (bs - 1):
            raise ValueError(f"kvcache_block_size must be a power of two >= 16, got {bs}")
        check_int("num_kvcache_blocks", self.num_kvcache_blocks, 1, none_ok=True)
        util = self.gpu_memory_utilization
        if not isinstance(util, (int, float)) or not 0.0 < util <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
        gb = self.kv_cache_memory_gb
        if not isinstance(gb, (int, float)) or not gb > 0:
            raise ValueError(f"kv_cache_memory_gb must be > 0, got {gb!r}")
        check_bools(self, "enable_prefix_caching", "enforce_eager")
        if not (self.async_scheduling is None or isinstance(self.async_scheduling, bool)):
            raise ValueError(f"async_scheduling must be a bool or None (on CUDA only), got {self.async_scheduling!r}")
        check_int("tensor_parallel_size", self.tensor_parallel_size, 1, 8)
        if not isinstance(self.attention_backend, str):
            raise ValueError(f"attention_backend must be a string, got {self.attention_backend!r}")
        check_int("seed", self.seed, 0)
        check_int("cpu_threads", self.cpu_threads, 1, none_ok=True)
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {self.load_format!r}")

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> Config:
        names = {f.name for f in dataclasses.fields(cls)} - {"model"}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown LLM config key(s) {unknown}; valid keys: {sorted(names)}")
        return cls(model=str(model), **kwargs)


@dataclass(frozen=True)
class RunnerSpec:
    """What a runner needs to know, resolved by the engine (picklable, sent to TP workers)."""

    model_path: str
    device: str
    dtype: torch.dtype
    backend: str
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_kvcache_blocks: int | None
    kv_cache_memory_gb: float
    gpu_memory_utilization: float
    enforce_eager: bool
    load_format: str = "auto"
    cpu_threads: int = 1  # torch intra-op threads on the CPU (resolved from Config.cpu_threads)


def resolve_spec(config: Config, hf_config: Any) -> RunnerSpec:
    from .attention import resolve_backend_name
    from .models import check_sliding_window

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA GPU")
    if config.dtype != "auto":
        dtype = getattr(torch, config.dtype)  # one of DTYPES
    elif device == "cpu":
        dtype = torch.float32
    else:
        ckpt = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
        dtype = ckpt if ckpt in (torch.bfloat16, torch.float16) else torch.bfloat16
    max_pos = hf_config.max_position_embeddings
    max_model_len = config.max_model_len or max_pos
    if max_model_len > max_pos:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={max_pos}")
    check_sliding_window(hf_config, max_model_len)
    return RunnerSpec(
        model_path=config.model, device=device, dtype=dtype,
        backend=resolve_backend_name(config.attention_backend, device, config.kvcache_block_size),
        block_size=config.kvcache_block_size,
        max_model_len=max_model_len, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, num_kvcache_blocks=config.num_kvcache_blocks,
        kv_cache_memory_gb=config.kv_cache_memory_gb, gpu_memory_utilization=config.gpu_memory_utilization,
        enforce_eager=config.enforce_eager, load_format=config.load_format,
        cpu_threads=config.cpu_threads or auto_cpu_threads(hf_config.hidden_size, config.tensor_parallel_size),
    )


def auto_cpu_threads(hidden_size: int, tp: int) -> int:
    """OMP_NUM_THREADS or the usable cores, shared by the TP ranks, and no more than hidden_size // 256."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cores = int(os.environ.get("OMP_NUM_THREADS") or 0) or usable
    return max(1, min(cores // tp, hidden_size // 256))
