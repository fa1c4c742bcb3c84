"""The torch path for sampling rows with penalties, logit bias, min_tokens, min-p or processed logprobs.

Only the rows that use these features come here (the fused sampler takes the others, unchanged), so plain
requests pay nothing for them. The order is transformers' logits processors then warpers, with vLLM's
presence and frequency penalties (which transformers lacks) after the repetition penalty, as vLLM applies them:

1. logit_bias added (transformers' SequenceBiasLogitsProcessor for single tokens; vLLM's LogitBias);
2. min_tokens: EOS and stop_token_ids to -inf while the output is shorter (MinNewTokensLengthLogitsProcessor);
3. repetition_penalty over prompt and output tokens: a logit < 0 is multiplied, else divided
   (RepetitionPenaltyLogitsProcessor);
4. frequency_penalty x (times the token was output) and presence_penalty x (output at all) subtracted
   (OpenAI's definition, vLLM's apply_penalties);
5. greedy rows take the argmax here; sampled rows: temperature, top-k, top-p, min-p (sampler.apply_warpers);
6. one draw from the softmax by the Gumbel-max trick with the request's counter-based noise.

The `processed_*` logprobs modes report step 5's result (vLLM: "after all processing, temperature and
top-k/top-p included"). References: transformers generation/logits_process.py and utils.py
(_get_logits_processor), vLLM v1/sample/sampler.py and v1/sample/ops/penalties.py.
"""

from __future__ import annotations

from itertools import chain

import torch

from ..kernels.sampling import gumbel_sample_reference
from ..sampling_params import ProcessedRow
from .sampler import SamplingBatch, apply_warpers


def process_logits(logits: torch.Tensor, rows: list[ProcessedRow], batch: SamplingBatch,
                   penalties: PenaltyCounts | None = None) -> torch.Tensor:
    """(m, vocab) raw logits of `rows` -> (m, vocab) float32 processed scores (steps 1-5); `batch` holds the
    rows' temperature, top_k and top_p (already indexed to `rows`; top-k and top-p skipped unless needs_filter)."""
    scores = logits.float().clone()
    _add_bias_and_min_tokens_mask(scores, rows)
    _apply_penalties(scores, rows, penalties or PenaltyCounts())
    min_p = torch.tensor([r.params.min_p for r in rows], device=scores.device)
    return apply_warpers(scores, batch.temperature, batch.top_k if batch.needs_filter else None, batch.top_p,
                         min_p if any(r.params.min_p > 0 for r in rows) else None)


def sample_processed(
    logits: torch.Tensor, batch: SamplingBatch, rows: list[ProcessedRow], packed: torch.Tensor,
    penalties: PenaltyCounts | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample `rows` of `logits` (n, vocab) on the torch path, writing their tokens into `packed` (2, n) (the fused
    sampler's output; its finite flags, of the raw logits, stay). Returns (row indices (m,), processed scores)."""
    idx = torch.tensor([r.row for r in rows], device=logits.device)
    filters = any(r.params.top_k > 0 or r.params.top_p < 1 for r in rows)  # else the warpers skip the sort
    sub = SamplingBatch(batch.temperature[idx], batch.top_k[idx], batch.top_p[idx], batch.seeds[idx],
                        batch.counters[idx], needs_filter=filters)
    scores = process_logits(logits[idx], rows, sub, penalties)
    # already scaled: temperature 1 for sampled rows, 0 (argmax) for greedy ones
    packed[0, idx] = gumbel_sample_reference(scores, (sub.temperature > 0).float(), sub.seeds, sub.counters)[0]
    return idx, scores


def _add_bias_and_min_tokens_mask(scores: torch.Tensor, rows: list[ProcessedRow]) -> None:
    """Steps 1 and 2 as one scatter-add: each logit_bias entry, and -inf on the stop tokens of a row whose output is
    shorter than min_tokens (a bias is finite, so -inf wins whatever was added before)."""
    entries = [(i, t, b) for i, r in enumerate(rows) for t, b in (r.params.logit_bias or {}).items()]
    entries += [(i, t, float("-inf")) for i, r in enumerate(rows)
                if len(r.token_ids) - r.num_prompt_tokens < r.params.min_tokens for t in r.stop_ids]
    if entries:
        i, t, b = (torch.tensor(column, device=scores.device) for column in zip(*entries))
        scores.index_put_((i, t), b.float(), accumulate=True)


class PenaltyCounts:
    """Per sequence, its output-token counts and seen-token mask (prompt or output) on the device, kept across
    steps: a step uploads only the tokens added since the sequence's last sampled step (usually one), not its
    whole history. Sequences absent from a step are dropped (rebuilt from their tokens if they come back)."""

    def __init__(self) -> None:
        self.state: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}  # seq_id -> (counts, seen, tokens in)

    def update(self, rows: list[ProcessedRow], vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(counts (m, vocab) float32 over output tokens, seen (m, vocab) bool over prompt and output tokens)."""
        olds = [self.state.get(r.seq_id) if _keeps(r) else None for r in rows]
        counts = torch.stack([o[0] if o else torch.zeros(vocab, device=device) for o in olds])
        seen = torch.stack([o[1] if o else torch.zeros(vocab, dtype=torch.bool, device=device) for o in olds])
        starts = [o[2] if o else 0 for o in olds]
        tokens = list(chain.from_iterable(r.token_ids[n:] for r, n in zip(rows, starts)))  # one upload
        row_of = [j for j, (r, n) in enumerate(zip(rows, starts)) for _ in range(len(r.token_ids) - n)]
        is_output = [float(p >= r.num_prompt_tokens) for r, n in zip(rows, starts) for p in range(n, len(r.token_ids))]
        if tokens:
            at = (torch.tensor(row_of, device=device), torch.tensor(tokens, device=device))
            counts.index_put_(at, torch.tensor(is_output, device=device), accumulate=True)
            seen[at] = True
        self.state = {r.seq_id: (counts[j], seen[j], len(r.token_ids)) for j, r in enumerate(rows) if _keeps(r)}
        return counts, seen


def _keeps(row: ProcessedRow) -> bool:
    """Whether a row's counts are kept for its sequence's next step: its own tokens (a verify row's drafts may be
    rejected: its counts are rebuilt each time)."""
    return row.seq_id >= 0 and row.draft_index == 0


def _apply_penalties(scores: torch.Tensor, rows: list[ProcessedRow], penalties: PenaltyCounts) -> None:
    chosen = [i for i, r in enumerate(rows) if r.params.uses_penalties]
    if not chosen:
        return
    dev = scores.device
    seqs = [rows[i] for i in chosen]
    counts, seen = penalties.update(seqs, scores.shape[1], dev)

    def column(name: str) -> torch.Tensor:
        return torch.tensor([getattr(r.params, name) for r in seqs], device=dev)[:, None]

    idx = torch.tensor(chosen, device=dev)
    x, rep = scores[idx], column("repetition_penalty")
    x = torch.where(seen, torch.where(x < 0, x * rep, x / rep), x)
    x = x - column("frequency_penalty") * counts - column("presence_penalty") * (counts > 0)
    scores[idx] = x


def logprob_scores(logits: torch.Tensor, rows: list[ProcessedRow],
                   processed: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """(n, vocab): what each row reports as logprobs, per its logprobs_mode (vLLM's names: raw_logprobs,
    raw_logits, processed_logprobs, processed_logits). `processed` = sample_processed's (row indices, scores)."""
    scores = logits.float().log_softmax(dim=-1)
    if processed is None:
        return scores
    idx, proc = processed
    pick = {"raw_logits": logits.float()[idx], "processed_logprobs": proc.log_softmax(dim=-1),
            "processed_logits": proc}
    for j, r in enumerate(rows):
        if r.params.logprobs_mode in pick:
            scores[r.row] = pick[r.params.logprobs_mode][j]
    return scores
