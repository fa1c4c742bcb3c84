"""Engine configuration: the keyword arguments of `LLM(model, **config)` as a frozen, validated dataclass.

An unknown key is a TypeError (nano-vllm silently dropped them); a bad value is a ValueError that names the
field and the limit. Values that depend on the checkpoint or the machine ("auto" device/dtype, the KV cache
size) are resolved later by the engine, never written back here.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from .sampling_params import check_bools, check_int

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # "auto": the model dtype; "fp8" = "fp8_e4m3" (vLLM's names)


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
    kv_cache_dtype: str = "auto"  # "fp8" / "fp8_e4m3": K and V as float8_e4m3fn with scales (kernels/kv_quant.py)
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    # schedule and launch the next step while the current one runs on the device (steps without logprobs)
    async_scheduling: bool = True
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
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
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
        check_bools(self, "enable_prefix_caching", "enforce_eager", "async_scheduling")
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
