"""From a checkpoint folder to what the engine is built from: the HF config, the tokenizer, and the runner's
resolved spec (device, dtype, attention backend, lengths, CPU threads).

References: transformers AutoConfig / AutoTokenizer.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ..config import Config
from ..models import check_sliding_window
from .model_runner import RunnerSpec


def load_hf_config(path: str) -> Any:
    from transformers import AutoConfig

    if not os.path.isdir(path):
        raise ValueError(f"model path {path!r} does not exist or is not a folder")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model folder {path!r} has no config.json")
    return AutoConfig.from_pretrained(path, trust_remote_code=False)


def load_tokenizer(path: str) -> Any | None:
    """The checkpoint's tokenizer, or None if it ships none (token-id prompts still work)."""
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if not any(os.path.isfile(os.path.join(path, n)) for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def resolve_spec(config: Config, hf_config: Any) -> RunnerSpec:
    from ..attention import resolve_backend_name

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA GPU")
    if config.dtype != "auto":
        dtype = getattr(torch, config.dtype)  # one of config.DTYPES
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
        kv_dtype=torch.float8_e4m3fn if config.kv_cache_dtype != "auto" else dtype,
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
