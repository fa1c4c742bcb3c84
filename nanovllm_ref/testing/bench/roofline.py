"""A roofline (lower bound on wall time) for an offline workload, from the model shape and device ceilings.

Model: every request is admitted at once; prefill is compute bound (matmul
FLOPs of all prompt tokens plus causal attention, at the measured bf16 matmul rate); then one decode step
per output token after the first, up to the longest output, each step memory bound: it reads every weight
once plus the KV cache of every sequence still running (its whole context) at the measured copy bandwidth.
Under tensor parallelism each GPU reads 1/tp of the bytes, so the ideal time divides by tp.

For the headline workload, Qwen3-0.6B, H200 (4.25 TB/s, 790 TFLOP/s) this gives ~3.7 s, i.e. at most
~36,000 output tok/s (3.74 s, 35,800 tok/s with the ceilings rounded as below).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .models import ModelShape

# An H200 as measured by device.measure_ceilings (2026-11-30); used when no ceilings are measured (e.g. planning
# on a CPU machine).
H200_COPY_GBPS = 4250.0
H200_MATMUL_TFLOPS = 790.0
H200_HEADLINE_ROOFLINE_S = 3.74  # the headline workload, Qwen3-0.6B bf16, on those ceilings


@dataclass(frozen=True)
class Ceilings:
    copy_gbps: float  # device-to-device copy, bytes read + written per second / 1e9
    matmul_tflops: float  # dense bf16 (fp32 on CPU) matmul
    device: str = "cuda"
    source: str = "measured"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


H200 = Ceilings(H200_COPY_GBPS, H200_MATMUL_TFLOPS, "NVIDIA H200", "H200 figures")


@dataclass(frozen=True)
class Roofline:
    seconds: float
    prefill_s: float
    decode_s: float
    decode_steps: int
    weight_bytes: float
    kv_read_bytes: float
    prefill_flops: float
    output_tokens: int
    total_tokens: int

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else float("inf")

    @property
    def total_tok_s(self) -> float:
        return self.total_tokens / self.seconds if self.seconds > 0 else float("inf")

    def as_dict(self) -> dict[str, float]:
        d = asdict(self)
        d.update(output_tok_s=self.output_tok_s, total_tok_s=self.total_tok_s)
        return d


def causal_pairs(query_len: int, context_len: int) -> int:
    """(query, key) pairs of `query_len` new tokens at the end of a `context_len`-token causal context."""
    start = context_len - query_len
    return query_len * start + query_len * (query_len + 1) // 2


def roofline(
    shape: ModelShape, prompt_lens: list[int], output_lens: list[int], ceilings: Ceilings = H200,
    tp: int = 1, dtype_bytes: int = 2, cached_prompt_tokens: int = 0, kv_dtype_bytes: int | None = None,
) -> Roofline:
    """Lower bound on the wall time of generating `output_lens[i]` tokens after `prompt_lens[i]`.

    `cached_prompt_tokens`: prompt tokens served from the prefix cache (their prefill FLOPs are skipped).
    `kv_dtype_bytes`: bytes per cached K/V element (1 for an FP8 cache; default: `dtype_bytes`). The headline on the
    H200 ceilings with 1-byte KV: 2.09 s (bf16 KV: 3.72 s), i.e. at most 64,100 output tok/s (bf16: 36,000).
    """
    bw = ceilings.copy_gbps * 1e9 * tp
    flops_rate = ceilings.matmul_tflops * 1e12 * tp
    prefill_tokens = sum(prompt_lens) - cached_prompt_tokens
    pairs = sum(causal_pairs(p, p) for p in prompt_lens)
    prefill_flops = (prefill_tokens * shape.linear_flops_per_token() + shape.attention_flops(pairs)
                     + len(prompt_lens) * shape.lm_head_flops_per_token())
    steps = max(output_lens, default=1) - 1
    kv_tokens = 0  # context tokens read over all decode steps: output i (2..out) attends to p + i - 1 tokens
    for p, out in zip(prompt_lens, output_lens):
        n = out - 1
        kv_tokens += n * p + n * (n + 1) // 2
    weight = shape.weight_bytes(dtype_bytes)
    kv_bytes = kv_tokens * shape.kv_bytes_per_token(kv_dtype_bytes or dtype_bytes)
    decode_s = (steps * weight + kv_bytes) / bw
    prefill_s = prefill_flops / flops_rate
    total_out = sum(output_lens)
    return Roofline(
        seconds=prefill_s + decode_s, prefill_s=prefill_s, decode_s=decode_s, decode_steps=steps,
        weight_bytes=float(weight), kv_read_bytes=float(kv_bytes), prefill_flops=float(prefill_flops),
        output_tokens=total_out, total_tokens=total_out + sum(prompt_lens),
    )


def decode_step_seconds(shape: ModelShape, batch: int, context: int, ceilings: Ceilings = H200, tp: int = 1) -> float:
    """Lower bound on one decode step (the TPOT floor) for `batch` sequences of `context` tokens."""
    return (shape.weight_bytes() + batch * context * shape.kv_bytes_per_token()) / (ceilings.copy_gbps * 1e9 * tp)
