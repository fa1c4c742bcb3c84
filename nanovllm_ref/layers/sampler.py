"""Vectorized sampling: greedy, temperature, top-k, top-p; seeded per request, batch-independent.

Randomness is counter-based: the noise for vocabulary entry v of a request's token at position t is a
hash of (seed, t, v) (PCG's output permutation, O'Neill 2014), turned into Gumbel noise for the Gumbel-max
trick. So a request's tokens depend only on its seed and its own logits: not on the batch it shares,
not on preemption and recompute, and the same on CPU and GPU. Logprobs are those of the raw model
distribution (log-softmax of the float32 logits), as vLLM returns by default. Top-k, top-p and min-p are
transformers' warpers exactly (generation/logits_process.py), in its order; rows with penalties, logit bias,
min_tokens, min-p or processed logprobs take the torch path of logits_processing.py for their rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.sampling import gumbel_sample, gumbel_sample_reference


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask to -inf what transformers' TopKLogitsWarper then TopPLogitsWarper remove (top_k <= 0, top_p = 1: off).

    Top-k keeps every token >= the k-th largest logit (ties with it stay); top-p sorts ascending and drops the
    tokens whose cumulative probability is <= 1 - top_p, always keeping the most likely one: the nucleus is the
    smallest set of top tokens whose mass reaches top_p, the token that crosses it included."""
    sorted_logits, order = logits.sort(dim=-1, stable=True)  # ascending, as TopPLogitsWarper
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    kth_largest = sorted_logits.gather(-1, (vocab - k)[:, None])
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_largest, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    drop = probs.cumsum(dim=-1) <= 1 - top_p[:, None]
    drop &= (top_p < 1)[:, None]  # top_p = 1 is off: underflowed tail probabilities must not be dropped
    drop[:, -1] = False
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def apply_warpers(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
                  top_p: torch.Tensor | None, min_p: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' warper order: temperature (greedy rows: 1), top-k, top-p, min-p; None skips a warper.
    (vLLM applies min-p before top-k/top-p: the two differ only when min_p and top_p are both set.)"""
    scores = logits.float() / torch.where(temperature > 0, temperature, 1.0)[:, None]
    if top_k is not None:
        scores = apply_top_k_top_p(scores, top_k, top_p)
    if min_p is None:
        return scores
    # transformers' MinPLogitsWarper: drop tokens less likely than min_p times the most likely one
    probs = scores.softmax(dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    return scores.masked_fill(probs < min_p[:, None] * top, float("-inf"))


@dataclass
class SamplingBatch:
    temperature: torch.Tensor  # (n,) float32, 0 = greedy
    top_k: torch.Tensor  # (n,) int64, <= 0 = off
    top_p: torch.Tensor  # (n,) float32
    seeds: torch.Tensor  # (n,) int64
    counters: torch.Tensor  # (n,) int64: the position of the token being sampled
    needs_filter: bool  # any row with top-k or top-p


def sample(logits: torch.Tensor, batch: SamplingBatch, use_kernels: bool = False) -> torch.Tensor:
    """(n, vocab) logits -> (2, n) int64: the sampled tokens, and 1 where the row's logits are all finite.
    use_kernels: the Triton draw (the plan's, CUDA), else the reference."""
    temp = batch.temperature
    finite = None
    if batch.needs_filter:  # (the filter writes -inf: the finiteness is that of the model's logits)
        finite = torch.isfinite(logits).all(dim=-1)
        logits = apply_warpers(logits, temp, batch.top_k, batch.top_p)
        temp = torch.where(temp > 0, 1.0, 0.0)  # already scaled; greedy rows keep their argmax
    draw = gumbel_sample if use_kernels else gumbel_sample_reference
    out = draw(logits.contiguous(), temp.contiguous(), batch.seeds.contiguous(), batch.counters.contiguous())
    if finite is not None:
        out[1] = finite
    return out


def top_logprobs(
    logits: torch.Tensor, chosen: torch.Tensor, k: int, scores: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw-distribution logprobs, or the given (n, vocab) `scores`: (chosen (n,), top-k ids (n, k), values (n, k))."""
    logprobs = logits.float().log_softmax(dim=-1) if scores is None else scores
    chosen_lp = logprobs.gather(-1, chosen[:, None].long())[:, 0]
    values, ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], chosen[:, None][:, :0])
    return chosen_lp, ids, values
