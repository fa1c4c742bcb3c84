"""Kernel benchmark cases and the timing harness shared by perf/test_kernels.py.

Timing (pytest-benchmark on a GPU):
- one benchmark round calls the kernel once on each of `n` rotating input sets, then synchronizes, all
  inside the timed function; `benchmark.pedantic` with warm-up rounds (the first call compiles);
- rotating sets defeat the L2 cache (60 MB on the H200): a set of >= 128 MiB is used alone, a smaller one
  is replicated into max(4, 256 MiB / set) sets, so every call reads its inputs from HBM;
- CUDA-event time of the same rounds is recorded in `extra_info` (the accurate figure: no launch or sync
  gap), with GB/s (or TFLOP/s) and the fraction of the measured ceiling computed from it.
On the CPU the same cases run at toy sizes through the pure-torch references (a smoke test of the harness).
The kernels come from the one kernel list conformance tests them from (nanovllm_ref.testing.kernels: `KERNELS`'
references, `nanovllm_ref_candidates`' Triton kernels), so a benchmark times what the kernel tests check.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from nanovllm_ref.layers.sampler import SamplingBatch, sample
from nanovllm_ref.testing.bench.device import sync, time_fn
from nanovllm_ref.testing.bench.roofline import Ceilings, causal_pairs
from nanovllm_ref.testing.kernels import KERNELS, nanovllm_ref_candidates

TRITON_LABELS = ("triton", "triton-splits-auto")  # nanovllm_ref's own kernel of each name, as the engine calls it

SINGLE_SET_BYTES = 128 * 2**20
ROTATE_BYTES = 256 * 2**20
MAX_SETS = 256


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    sets: list[tuple]
    bytes_per_call: float = 0.0
    flops_per_call: float = 0.0
    set_bytes: int = 0


def num_sets(set_bytes: int, device: str) -> int:
    if device != "cuda" or set_bytes >= SINGLE_SET_BYTES:
        return 1
    return min(MAX_SETS, max(4, math.ceil(ROTATE_BYTES / max(set_bytes, 1))))


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_nbytes(o) for o in obj)
    return 0


def _replicate(make: Callable[[int], tuple], device: str) -> tuple[list[tuple], int]:
    first = make(0)
    size = _nbytes(first)
    return [first] + [make(i) for i in range(1, num_sets(size, device))], size


def _triton(device: str) -> bool:
    return device == "cuda"


def kernel(name: str, device: str) -> Callable:
    """The kernel a case of `name` (a key of KERNELS) times: nanovllm_ref's Triton kernel on a GPU, else the
    pure-torch reference (the CPU smoke run)."""
    if not _triton(device):
        return KERNELS[name].reference
    return next(c.fn for c in nanovllm_ref_candidates() if c.kernel == name and c.label in TRITON_LABELS)


def store_kv_case(shape: Any, num_tokens: int, device: str, dtype: torch.dtype, block_size: int = 16,
                  scattered: bool = False) -> Case:
    """Slots as the engine lays them out: consecutive rows of blocks drawn at random from a pool twice the size
    needed (a prefill fills whole blocks); `scattered`: every token in a random slot (the worst case)."""
    kvh, hd = shape.num_kv_heads, shape.head_dim
    num_blocks = 2 * -(-num_tokens // block_size)

    def slot_mapping(g: torch.Generator) -> torch.Tensor:
        if scattered:
            return torch.randperm(num_blocks * block_size, device=device, generator=g)[:num_tokens]
        blocks = torch.randperm(num_blocks, device=device, generator=g)[: num_blocks // 2]
        rows = torch.arange(block_size, device=device)
        return (blocks[:, None] * block_size + rows).flatten()[:num_tokens]

    def make(i: int) -> tuple:
        g = torch.Generator(device=device).manual_seed(i)
        key = torch.randn(num_tokens, kvh, hd, device=device, dtype=dtype, generator=g)
        value = torch.randn(num_tokens, kvh, hd, device=device, dtype=dtype, generator=g)
        k_cache = torch.zeros(num_blocks, block_size, kvh, hd, device=device, dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        return key, value, k_cache, v_cache, slot_mapping(g)

    sets, size = _replicate(make, device)
    moved = 2 * 2 * num_tokens * kvh * hd * torch.finfo(dtype).bits // 8 + 8 * num_tokens  # K, V read + written
    name = f"store_kv-t{num_tokens}" + ("-scattered" if scattered else "")
    return Case(name, kernel("store_kv", device), sets, moved, set_bytes=size)


def _paged(contexts: list[int], shape: Any, device: str, dtype: torch.dtype, block_size: int, seed: int,
           width_blocks: int | None = None) -> tuple:
    """Random K/V caches holding one context per entry of `contexts` in shuffled blocks, their block tables
    (zero-padded to `width_blocks` columns; default: the longest context's blocks) and seq_lens."""
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = [-(-n // block_size) for n in contexts]
    cache_shape = (sum(blocks), block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, device=device, dtype=dtype, generator=g)
    v_cache = torch.randn(cache_shape, device=device, dtype=dtype, generator=g)
    perm = torch.randperm(sum(blocks), device=device, generator=g).to(torch.int32)
    tables = torch.zeros(len(contexts), width_blocks or max(blocks), dtype=torch.int32, device=device)
    for row, (start, n) in enumerate(zip(itertools.accumulate([0, *blocks]), blocks)):
        tables[row, :n] = perm[start:start + n]
    seq_lens = torch.tensor(contexts, dtype=torch.int32, device=device)
    return k_cache, v_cache, tables, seq_lens, g


def decode_case(shape: Any, batch: int, ctx: int, device: str, dtype: torch.dtype, block_size: int = 16) -> Case:
    scale = shape.head_dim**-0.5

    def make(i: int) -> tuple:
        k_cache, v_cache, tables, seq_lens, g = _paged([ctx] * batch, shape, device, dtype, block_size, i)
        q = torch.randn(batch, shape.num_heads, shape.head_dim, device=device, dtype=dtype, generator=g)
        return q, k_cache, v_cache, tables, seq_lens, scale

    sets, size = _replicate(make, device)
    elem = torch.finfo(dtype).bits // 8
    kv = 2 * batch * ctx * shape.num_kv_heads * shape.head_dim * elem
    qo = 2 * batch * shape.num_heads * shape.head_dim * elem
    return Case(f"decode-b{batch}-ctx{ctx}", kernel("decode_attention", device), sets, kv + qo, set_bytes=size)


def decode_mixed_case(shape: Any, contexts: list[int], device: str, dtype: torch.dtype, block_size: int = 16,
                      max_model_len: int = 4096, name: str = "decode-mixed") -> Case:
    """Decode attention as the engine calls it on a batch of mixed context lengths (e.g. a headline step):
    shuffled blocks, longest context first, splits decided by the batch's CUDA-graph bucket and max_model_len."""
    from nanovllm_ref.attention.metadata import decode_batch_bucket
    from nanovllm_ref.kernels.decode_attention import decode_attention

    scale = shape.head_dim**-0.5
    num_seqs, elem = len(contexts), torch.finfo(dtype).bits // 8

    def make(i: int) -> tuple:
        k_cache, v_cache, tables, seq_lens, g = _paged(contexts, shape, device, dtype, block_size, i,
                                                       width_blocks=-(-max_model_len // block_size))
        q = torch.randn(num_seqs, shape.num_heads, shape.head_dim, device=device, dtype=dtype, generator=g)
        order = torch.argsort(seq_lens, descending=True, stable=True).to(torch.int32)
        return q, k_cache, v_cache, tables, seq_lens, order

    def call(q, k_cache, v_cache, tables, seq_lens, order):
        if not _triton(device):
            return KERNELS["decode_attention"].reference(q, k_cache, v_cache, tables, seq_lens, scale)
        return decode_attention(q, k_cache, v_cache, tables, seq_lens, scale, max_seq_len=max_model_len,
                                split_batch=decode_batch_bucket(num_seqs), order=order)

    sets, size = _replicate(make, device)
    kv = 2 * sum(contexts) * shape.num_kv_heads * shape.head_dim * elem
    qo = 2 * num_seqs * shape.num_heads * shape.head_dim * elem
    return Case(name, call, sets, kv + qo, set_bytes=size)


def prefill_case(shape: Any, num_seqs: int, q_len: int, device: str, dtype: torch.dtype, block_size: int = 16) -> Case:
    scale = shape.head_dim**-0.5

    def make(i: int) -> tuple:
        k_cache, v_cache, tables, seq_lens, g = _paged([q_len] * num_seqs, shape, device, dtype, block_size, i)
        q = torch.randn(num_seqs * q_len, shape.num_heads, shape.head_dim, device=device, dtype=dtype, generator=g)
        qsl = torch.arange(0, (num_seqs + 1) * q_len, q_len, dtype=torch.int32, device=device)
        if _triton(device):
            return q, k_cache, v_cache, qsl, seq_lens, tables, scale, q_len
        return q, k_cache, v_cache, qsl, seq_lens, tables, scale

    sets, size = _replicate(make, device)
    flops = 4 * shape.num_heads * shape.head_dim * num_seqs * causal_pairs(q_len, q_len)
    return Case(f"prefill-{num_seqs}x{q_len}", kernel("prefill_attention", device), sets, flops_per_call=flops,
                set_bytes=size)


def rmsnorm_case(num_tokens: int, hidden: int, device: str, dtype: torch.dtype) -> Case:
    def make(i: int) -> tuple:
        g = torch.Generator(device=device).manual_seed(i)
        x = torch.randn(num_tokens, hidden, device=device, dtype=dtype, generator=g)
        res = torch.randn(num_tokens, hidden, device=device, dtype=dtype, generator=g)
        return x, torch.ones(hidden, device=device, dtype=dtype), 1e-6, res

    sets, size = _replicate(make, device)
    moved = 4 * num_tokens * hidden * torch.finfo(dtype).bits // 8  # x, residual in; out, residual out
    return Case(f"rmsnorm-t{num_tokens}-h{hidden}", kernel("rms_norm", device), sets, moved, set_bytes=size)


def sampler_case(batch: int, vocab: int, temperature: float, device: str, dtype: torch.dtype) -> Case:
    """The logits in the model's dtype, as the LM head returns them."""
    def make(i: int) -> tuple:
        g = torch.Generator(device=device).manual_seed(i)
        logits = torch.randn(batch, vocab, device=device, dtype=dtype, generator=g)
        sb = SamplingBatch(
            temperature=torch.full((batch,), temperature, device=device), top_k=torch.full((batch,), -1, device=device),
            top_p=torch.ones(batch, device=device), seeds=torch.arange(batch, device=device) + 1000 * i,
            counters=torch.full((batch,), 100, device=device), needs_filter=False,
        )
        return logits, sb

    sets, size = _replicate(make, device)
    kind = "greedy" if temperature == 0 else f"t{temperature}"
    return Case(f"sampler-{kind}-b{batch}-v{vocab}", sample, sets, torch.finfo(dtype).bits // 8 * batch * vocab,
                set_bytes=size)


def run_case(benchmark: Any, case: Case, device: str, ceilings: Ceilings, rounds: int, warmup_rounds: int,
             event_reps: int) -> dict[str, Any]:
    """Benchmark one case (see the module docstring); returns (and stores in extra_info) the derived figures."""
    sets, fn = case.sets, case.fn

    def one_round() -> None:
        for args in sets:
            fn(*args)

    def timed() -> None:
        one_round()
        sync(device)

    benchmark.pedantic(timed, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
    n = len(sets)
    event_s = statistics.median(time_fn(one_round, event_reps, device, warmup=1)) / n
    info: dict[str, Any] = {"case": case.name, "calls_per_round": n, "set_mib": round(case.set_bytes / 2**20, 2),
                            "us_per_call_event": event_s * 1e6, "timer": "cuda_event" if device == "cuda" else "cpu"}
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    if stats is not None:
        info["us_per_call_wall"] = stats.median / n * 1e6
    if case.bytes_per_call:
        gbps = case.bytes_per_call / event_s / 1e9
        info.update(bytes_per_call=case.bytes_per_call, gbps=gbps, copy_ceiling_gbps=ceilings.copy_gbps,
                    fraction_of_ceiling=gbps / ceilings.copy_gbps)
    if case.flops_per_call:
        tflops = case.flops_per_call / event_s / 1e12
        info.update(flops_per_call=case.flops_per_call, tflops=tflops, matmul_ceiling_tflops=ceilings.matmul_tflops,
                    fraction_of_ceiling=tflops / ceilings.matmul_tflops)
    benchmark.extra_info.update(info)
    return info
