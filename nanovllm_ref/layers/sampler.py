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

from ..kernels.sampling import gumbel_sample, gumbel_sample_reference, row_keys, uniform_noise


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor, vocab: int) -> torch.Tensor:
    """(n, vocab) float32 uniform in (0, 1): the noise source of sampling, exposed for tests."""
    return uniform_noise(row_keys(seeds, counters), vocab)


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


def sample(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """(n, vocab) logits -> (2, n) int64: the sampled tokens, and 1 where the row's logits are all finite."""
    temp = batch.temperature
    finite = None
    if batch.needs_filter:  # (the filter writes -inf: the finiteness is that of the model's logits)
        finite = torch.isfinite(logits).all(dim=-1)
        scaled = logits.float() / torch.where(temp > 0, temp, 1.0)[:, None]
        logits = apply_top_k_top_p(scaled, batch.top_k, batch.top_p)
        temp = torch.where(temp > 0, 1.0, 0.0)  # already scaled; greedy rows keep their argmax
    draw = gumbel_sample if logits.is_cuda else gumbel_sample_reference
    out = draw(logits.contiguous(), temp.contiguous(), batch.seeds.contiguous(), batch.counters.contiguous())
    if finite is not None:
        out[1] = finite
    return out


def top_logprobs(
    logits: torch.Tensor, chosen: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw-distribution logprobs: (chosen (n,), top-k ids (n, k), top-k values (n, k))."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen_lp = logprobs.gather(-1, chosen[:, None].long())[:, 0]
    values, ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], chosen[:, None][:, :0])
    return chosen_lp, ids, values
