"""Engine configuration: the keyword arguments of `LLM(model, **config)` as a frozen, validated dataclass; the
checkpoint's architecture (`ModelConfig`, read once from its HF config); and what they resolve to on a machine
(`RunnerSpec` and its `Plan`, made once by `resolve_spec`).

An unknown key is a TypeError (nano-vllm silently dropped them); a bad value is a ValueError that names the
field and the limit. Values that depend on the checkpoint or the machine ("auto" device/dtype, the KV cache
size) are resolved into the RunnerSpec, never written back into the Config. The `Plan` is every feature decision
the modules need (kernels or references, batch invariance, the fused QKV epilogue, the fp8 decode kernel): the
modules receive it when they are built and pick their functions then, never per call (vLLM's dispatch-once
`CustomOp`; gpt-fast's model transforms). The environment is read in one module, env.py.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import env
from .sampling_params import check_bools, check_int, check_number
from .speculative import SpeculativeConfig

if TYPE_CHECKING:  # torch loads with the engine, not with the CLI's argument checks
    import torch

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")  # "auto": the model dtype; "fp8" = "fp8_e4m3" (vLLM's names)
LOAD_FORMATS = ("auto", "dummy")
INVARIANT_BACKENDS = ("auto", "torch", "triton")  # batch_invariant=True: "auto" is torch on the CPU, triton on CUDA
BACKEND_NAMES = ("flash-attn", "sdpa", "torch", "triton")  # attention/'s registry (attention.BACKENDS)
FLASH_ATTN_PAGE_MULTIPLE = 256  # FA2's paged KV cache: page_block_size must be divisible by 256
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


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
    # a request's tokens and logprobs bitwise independent of the rest of the batch (kernels/matmul.py says how)
    batch_invariant: bool = False
    # speculative decoding (speculative.py): a SpeculativeConfig or a dict of its fields (vLLM's names); None: off
    speculative_config: SpeculativeConfig | dict | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, (str, os.PathLike)):
            raise ValueError(f"model must be a path to a local checkpoint folder, got {self.model!r}")
        for name, choices in (("device", DEVICES), ("dtype", DTYPES), ("kv_cache_dtype", KV_CACHE_DTYPES),
                              ("load_format", LOAD_FORMATS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        for name, low, high in (("max_num_seqs", 1, None), ("max_num_batched_tokens", 1, None),
                                ("kvcache_block_size", 16, None), ("tensor_parallel_size", 1, 8), ("seed", 0, None)):
            check_int(name, getattr(self, name), low, high)
        for name in ("max_model_len", "num_kvcache_blocks", "cpu_threads"):
            check_int(name, getattr(self, name), 1, none_ok=True)
        bs = self.kvcache_block_size
        if bs & (bs - 1):
            raise ValueError(f"kvcache_block_size must be a power of two >= 16, got {bs}")
        check_number("gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True)
        check_number("kv_cache_memory_gb", self.kv_cache_memory_gb, 0.0, math.inf, low_open=True)
        check_bools(self, "enable_prefix_caching", "enforce_eager", "batch_invariant")
        if not (self.async_scheduling is None or isinstance(self.async_scheduling, bool)):
            raise ValueError(f"async_scheduling must be a bool or None (on CUDA only), got {self.async_scheduling!r}")
        if not isinstance(self.attention_backend, str):
            raise ValueError(f"attention_backend must be a string, got {self.attention_backend!r}")
        self._check_speculative()
        if self.batch_invariant and self.attention_backend not in INVARIANT_BACKENDS:
            raise ValueError(f"batch_invariant=True needs attention_backend in {INVARIANT_BACKENDS} (the fixed-order "
                             f"paths), got {self.attention_backend!r}")

    def _check_speculative(self) -> None:
        spec = SpeculativeConfig.from_value(self.speculative_config)
        object.__setattr__(self, "speculative_config", spec)
        if spec is None:
            return
        if self.async_scheduling:  # a verify step's accepted count is needed before the next step is scheduled
            raise ValueError("async_scheduling=True does not combine with speculative_config: leave it None or False")
        if spec.method == "draft_model" and self.tensor_parallel_size > 1:
            raise ValueError("speculative_config with a draft model needs tensor_parallel_size=1 (ngram works with "
                             "tensor parallelism)")

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> Config:
        names = {f.name for f in dataclasses.fields(cls)} - {"model"}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown LLM config key(s) {unknown}; valid keys: {sorted(names)}")
        return cls(model=str(model), **kwargs)


@dataclass(frozen=True)
class ModelConfig:
    """The architecture the models are built from: transformers' field names, read once from the HF config (both
    RoPE dialects: `rope_parameters`, or `rope_theta` + `rope_scaling`: `rope_parameters` below), with its defaults.
    Fields that no model here implements (another activation, shared experts, a RoPE type) are refused there."""

    architectures: tuple[str, ...]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_parameters: tuple[tuple[str, Any], ...]  # sorted (key, value) items: dict(...) to read
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # only where the checkpoint uses it (Qwen2's use_sliding_window)
    dtype: torch.dtype | None = None  # the checkpoint's weights
    eos_token_id: int | tuple[int, ...] | None = None
    # mixture of experts (Qwen3-MoE); num_experts 0: dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        given = {f.name: v for f in dataclasses.fields(cls) if (v := getattr(hf, f.name, None)) is not None}
        heads, eos = hf.num_attention_heads, given.get("eos_token_id")
        if given.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {given['hidden_act']!r} is not supported (only 'silu')")
        for name in ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts"):
            if getattr(hf, name, None):
                raise ValueError(f"config field {name}={getattr(hf, name)!r}: shared experts are not supported "
                                 "(transformers' Qwen3-MoE has none)")
        return cls(**{
            **given, "architectures": tuple(given.get("architectures", ())),
            "num_key_value_heads": given.get("num_key_value_heads", heads),
            "head_dim": given.get("head_dim") or hf.hidden_size // heads, "rms_norm_eps": float(hf.rms_norm_eps),
            "rope_parameters": tuple(sorted(rope_parameters(hf).items())),
            "sliding_window": None if getattr(hf, "use_sliding_window", None) is False else given.get("sliding_window"),
            # `dtype` (transformers 5) or `torch_dtype` as stored: its property warns that it is deprecated
            "dtype": given.get("dtype") or vars(hf).get("torch_dtype"),
            "eos_token_id": tuple(eos) if isinstance(eos, list) else eos,
            "mlp_only_layers": tuple(given.get("mlp_only_layers", ())),
        })


def rope_parameters(hf_config: Any) -> dict:
    """The checkpoint's RoPE settings in transformers' v5 form, from `rope_parameters` (v5) or `rope_scaling` (or
    nothing) with `rope_theta` at the top level (v4). Types this engine does not implement are refused."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("rope_parameters.partial_rotary_factor != 1 is not supported")
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling type {params['rope_type']!r} (config field rope_scaling/rope_parameters) is not "
            f"supported; supported: {SUPPORTED_ROPE_TYPES}"
        )
    return params


@dataclass(frozen=True)
class Plan:
    """What the modules are built for, resolved once (`resolve_plan`): each layer picks its function from it in
    `__init__` (kernel or reference, batch-invariant or not). The defaults are the CPU's reference path."""

    device: str = "cpu"
    dtype: torch.dtype | None = None  # the model's (None: torch's default)
    kv_dtype: torch.dtype | None = None  # the model's, or float8_e4m3fn (with per-head scales)
    backend: str = "sdpa"  # the attention backend (attention.BACKENDS)
    batch_invariant: bool = False  # a row's results independent of the rest of the batch (kernels/matmul.py)
    use_kernels: bool = False  # the Triton kernels (CUDA) for norms, SwiGLU, MoE, sampling; else the torch references
    fused_epilogue: bool = False  # q/k norm, RoPE and the KV store in one kernel where the backend's store allows it
    gluon_fp8_decode: bool = False  # an fp8 cache's decode by the Gluon kernel where it fits (sm_90)
    slow_kernels: bool = False  # the decode kernel's deliberately slow tiles (the perf gate's demo regression)
    cpu_weight_layout: bool = False  # linear weights column-major after loading (the CPU BLAS's faster product)
    cuda_graphs: bool = False  # decode steps replayed from captured CUDA graphs
    tp_size: int = 1

    @property
    def kv_fp8(self) -> bool:
        return self.kv_dtype is not None and self.kv_dtype.itemsize == 1


REFERENCE_PLAN = Plan()  # the default of modules built outside an engine (tests): the CPU's torch references


def resolve_plan(config: Config, device: str, dtype: torch.dtype, kv_dtype: torch.dtype, backend: str) -> Plan:
    """The feature decisions for `config` on `device`: the environment's (env.py) read here, once."""
    import torch

    cuda = device == "cuda"
    return Plan(
        device=device, dtype=dtype, kv_dtype=kv_dtype, backend=backend, batch_invariant=config.batch_invariant,
        use_kernels=cuda, fused_epilogue=cuda,
        gluon_fp8_decode=cuda and env.gluon_fp8_default(torch.device(device)), slow_kernels=env.slow_kernels(),
        cpu_weight_layout=not cuda, cuda_graphs=cuda and not config.enforce_eager,
        tp_size=config.tensor_parallel_size,
    )


def flash_attn_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def resolve_backend_name(name: str, device: str, block_size: int = 16, batch_invariant: bool = False) -> str:
    """"auto": sdpa on the CPU; on CUDA flash-attn when it imports and the block size suits it, else triton. In
    batch-invariant mode "auto" is the fixed-order path of the device: torch on the CPU, triton on CUDA."""
    if name == "auto":
        if device == "cpu":
            return "torch" if batch_invariant else "sdpa"
        fa_fits = flash_attn_available() and block_size % FLASH_ATTN_PAGE_MULTIPLE == 0
        return "flash-attn" if fa_fits and not batch_invariant else "triton"
    if name not in BACKEND_NAMES:
        raise ValueError(f"attention_backend must be 'auto' or one of {sorted(BACKEND_NAMES)}, got {name!r}")
    return name


@dataclass(frozen=True)
class RunnerSpec:
    """The Config as resolved for this checkpoint on this machine (picklable, sent to TP workers)."""

    config: Config
    plan: Plan
    max_model_len: int
    cpu_threads: int  # torch intra-op threads on the CPU

    @property
    def device(self) -> str:
        return self.plan.device

    @property
    def dtype(self) -> torch.dtype:
        return self.plan.dtype

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.plan.kv_dtype

    @property
    def backend(self) -> str:
        return self.plan.backend


def resolve_spec(config: Config, model: ModelConfig) -> RunnerSpec:
    import torch

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
        dtype = model.dtype if model.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    max_pos = model.max_position_embeddings
    max_model_len = config.max_model_len or max_pos
    if max_model_len > max_pos:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={max_pos}")
    window = model.sliding_window  # sliding-window attention is not implemented: refuse runs where it would matter
    if window and max_model_len > window:
        raise ValueError(f"config sliding_window={window} < max_model_len={max_model_len}: sliding-window attention "
                         f"is not implemented; set max_model_len <= {window}")
    backend = resolve_backend_name(config.attention_backend, device, config.kvcache_block_size, config.batch_invariant)
    kv_dtype = torch.float8_e4m3fn if config.kv_cache_dtype != "auto" else dtype
    return RunnerSpec(
        config, resolve_plan(config, device, dtype, kv_dtype, backend), max_model_len=max_model_len,
        cpu_threads=config.cpu_threads or auto_cpu_threads(model.hidden_size, config.tensor_parallel_size),
    )


def auto_cpu_threads(hidden_size: int, tp: int) -> int:
    """OMP_NUM_THREADS or the usable cores, shared by the TP ranks, and no more than hidden_size // 256."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cores = env.omp_num_threads() or usable
    return max(1, min(cores // tp, hidden_size // 256))
