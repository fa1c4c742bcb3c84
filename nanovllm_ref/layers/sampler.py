"""Vectorized sampling: greedy, temperature, top-k, top-p; seeded per request, batch-independent.

Randomness is counter-based: the noise for vocabulary entry v of a request's token at position t is a
hash of (seed, t, v) (PCG's output permutation, O'Neill 2014), turned into Gumbel noise for the Gumbel-max
trick. So a request's tokens depend only on its seed and its own logits: not on the batch it shares,
not on preemption and recompute, and the same on CPU and GPU. Logprobs are those of the raw model
distribution (log-softmax of the float32 logits), as vLLM returns by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


def _pcg_hash(x: torch.Tensor) -> torch.Tensor:  # int64 in [0, 2^32) -> int64 in [0, 2^32)
    state = (x * 747796405 + 2891336453) & _M32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _M32
    return ((word >> 22) ^ word) & _M32


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor, vocab: int) -> torch.Tensor:
    """(n, vocab) float32 uniform in (0, 1) from per-row int64 seeds and counters."""
    h = _pcg_hash((seeds ^ (seeds >> 32)) & _M32)
    h = _pcg_hash((h + counters) & _M32)
    idx = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    bits = _pcg_hash((h[:, None] + idx[None, :]) & _M32) >> 8  # 24 bits: exact in float32
    return (bits.float() + 0.5) * (1.0 / (1 << 24))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf every token outside each row's top-k and top-p nucleus. top_k <= 0 means off."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, logits.shape[-1])[:, None]
    drop = rank >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p[:, None]  # the top token always stays (mass before it is 0)
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # (n,) float32, 0 = greedy
    top_k: torch.Tensor  # (n,) int64, <= 0 = off
    top_p: torch.Tensor  # (n,) float32
    seeds: torch.Tensor  # (n,) int64
    counters: torch.Tensor  # (n,) int64: the position of the token being sampled
    needs_filter: bool  # any row with top-k or top-p


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:  # (n, vocab) float32 -> (n,)
    greedy = logits.argmax(dim=-1)
    temp = batch.temperature
    if bool((temp == 0).all()):
        return greedy
    scaled = logits / torch.where(temp > 0, temp, 1.0)[:, None]
    if batch.needs_filter:
        scaled = apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
    gumbel = -torch.log(-torch.log(counter_uniform(batch.seeds, batch.counters, logits.shape[-1])))
    sampled = (scaled.log_softmax(dim=-1) + gumbel).argmax(dim=-1)
    return torch.where(temp > 0, sampled, greedy)


def top_logprobs(
    logits: torch.Tensor, chosen: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw-distribution logprobs: (chosen (n,), top-k ids (n, k), top-k values (n, k))."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen_lp = logprobs.gather(-1, chosen[:, None].long())[:, 0]
    values, ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], chosen[:, None][:, :0])
    return chosen_lp, ids, values
