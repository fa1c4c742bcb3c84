"""Verifying speculative drafts: which proposed tokens a step accepts, and the token after them.

A sequence with drafts d_0..d_{k-1} has k + 1 sampling rows in the step (inputs.py): row i holds the target's
distribution p_i of the token at position n + i given the drafts before it, sampled as every row is (the request's
processing, then the Gumbel-max draw with its counter-based noise at that position: layers/sampler.py). The sample
x_i of each row is the token the target would emit there, so:

- n-gram drafts (a point mass q = 1 at d_i): accepting d_i when x_i == d_i is rejection sampling with that q,
  realised with the target's own noise: it is accepted with probability p_i(d_i) = min(1, p_i / q_i), and on a
  rejection x_i is a draw from p_i without d_i, i.e. norm(max(0, p_i - q_i)). The same holds for greedy requests (x_i
  is the argmax). A speculative run therefore emits, token for token, what the plain engine draws with that seed.
- draft-model drafts drawn from a full distribution q_i: the rows of sampled requests are redrawn by the rejection
  rule (`resample_rejected`, kernels/rejection.py: accept with min(1, p/q), else draw from norm(max(0, p - q)), a bonus
  draw from p_k when all are accepted), whose rows then agree with the drafts up to the first rejection.

Either way the accepted drafts are the longest prefix on which the rows' tokens and the drafts agree, and the next
token is the first disagreeing row's (or the bonus row's). The logprobs of the emitted tokens are the target's,
from their rows. References: Leviathan et al. 2023, Chen et al. 2023; vLLM v1/sample/rejection_sampler.py.
"""

from __future__ import annotations

from typing import Any

import torch

from ..kernels.rejection import rejection_sample, rejection_sample_reference
from ..layers.sampler import SamplingBatch, apply_warpers
from .inputs import StepInput

NON_FINITE = "the model produced non-finite logits (NaN or inf)"


def take_verified(out: Any, step: StepInput, tokens: list[int], finite: list[int]) -> None:
    """Into `out` (a StepOutput): per sequence of `step.drafts`, its accepted drafts, the token after them and their
    logprobs (`out.logprobs` holds one entry per row of the sequence's: trimmed to those emitted); a non-finite row
    among those read is the sequence's error. Its rows are then marked judged (finite) for the caller's check."""
    for seq_id, first, drafts in step.drafts:
        num_rows = len(drafts) + 1
        rows = tokens[first : first + num_rows]
        a = 0
        while a < len(drafts) and rows[a] == drafts[a] and finite[first + a]:
            a += 1
        if all(finite[first : first + a + 1]):
            out.sampled[seq_id], out.accepted[seq_id] = rows[a], drafts[:a]
            if seq_id in out.logprobs:
                out.logprobs[seq_id] = out.logprobs[seq_id][: a + 1]
        else:
            out.errors[seq_id] = NON_FINITE
            out.sampled.pop(seq_id, None)
            out.logprobs.pop(seq_id, None)
        finite[first : first + num_rows] = [1] * num_rows


def gather_logprobs(out: Any, step: StepInput, entries: list[dict[int, float]]) -> None:
    """`out.logprobs` of the sequences verifying drafts: every row's entry, in order (`take_verified` trims them)."""
    for seq_id, first, drafts in step.drafts:
        if seq_id in out.logprobs:
            out.logprobs[seq_id] = entries[first : first + len(drafts) + 1]


def target_probs(logits: torch.Tensor, batch: SamplingBatch, processed: Any) -> torch.Tensor:
    """(n, vocab) float32: each sampling row's distribution as the sampler draws from it (temperature, top-k, top-p;
    the processing path's scores for its rows)."""
    scores = apply_warpers(logits, batch.temperature, batch.top_k if batch.needs_filter else None, batch.top_p)
    if processed is not None:
        idx, proc = processed
        scores[idx] = proc
    return scores.softmax(dim=-1)


def resample_rejected(packed: torch.Tensor, step: StepInput, logits: torch.Tensor, batch: SamplingBatch,
                      processed: Any, draft_probs: torch.Tensor, use_kernels: bool) -> None:
    """Redraw the rows of the sampled requests among `step.drafts` (B, in order; `draft_probs` (B, K, vocab): the
    distributions their drafts were drawn from) by the rejection rule, writing the tokens into `packed` (2, n)."""
    chosen = [(b, first, drafts) for b, (_, first, drafts) in enumerate(step.drafts) if step.temperature[first] > 0]
    if not chosen:
        return
    dev, k = logits.device, draft_probs.shape[1]
    # (B, K + 1): each sequence's rows, its last one repeated past its drafts (ignored there)
    rows = torch.tensor([[first + min(i, len(d)) for i in range(k + 1)] for _, first, d in chosen], device=dev)
    draft_tokens = torch.tensor([d + [0] * (k - len(d)) for _, _, d in chosen], device=dev)
    num_drafts = torch.tensor([len(d) for _, _, d in chosen], device=dev)
    firsts = rows[:, 0]
    sample = rejection_sample if use_kernels else rejection_sample_reference
    tokens = sample(target_probs(logits, batch, processed)[rows], draft_probs[[b for b, _, _ in chosen]],
                    draft_tokens, num_drafts, batch.seeds[firsts], batch.counters[firsts])  # (B, K + 1), -1 after
    emitted = torch.arange(k + 1, device=dev) <= num_drafts[:, None]  # each row once (the repeated ones are not)
    packed[0, rows[emitted]] = torch.where(tokens >= 0, tokens, packed[0, rows])[emitted]  # -1: after the emitted
