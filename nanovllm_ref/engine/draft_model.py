"""A draft model's proposals: a smaller checkpoint with the target's vocabulary proposes k tokens autoregressively.

The draft has its own ModelRunner and KV cache, with as many blocks as the target's and indexed by the same block
tables (vLLM's draft-model proposer shares them the same way): the scheduler's blocks for a sequence hold the
target's KV in one cache and the draft's in the other. A sequence's draft KV is valid up to `seq.draft_state`'s
count (reset by a preemption, which frees the blocks): each step first catches the draft up on the tokens since
(at first the whole sequence: a prefix-cache hit of the target's holds no draft KV), which yields the distribution
of the first draft, then runs one token at a time for the others. The drafts are drawn from the request's own
distribution (temperature, top-k, top-p; greedy: the argmax) with the request's seed salted, so that the draft's
noise is independent of the target's; the distributions are handed to the verification (verify.py), which needs
them for the rejection rule.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from ..config import ModelConfig, RunnerSpec, resolve_spec
from ..layers.sampler import SamplingBatch, apply_warpers, sample
from ..loader import load_hf_config, load_tokenizer
from ..speculative import SpeculativeConfig
from .inputs import chunks_step
from .model_runner import ModelRunner
from .scheduler import SchedulerOutput, lookahead_room
from .sequence import Sequence

DRAFT_SEED_SALT = 0x5DEECE66D  # xored into a request's seed for its draft draws


def draft_reserve(config: SpeculativeConfig, target: RunnerSpec) -> tuple[int, int]:
    """What the draft needs beside the target's memory budget: (its KV bytes per block, its weights' bytes, bounded
    by its safetensors files), for the target's runner to leave (ModelRunner's `reserve`)."""
    mc = ModelConfig.from_hf(load_hf_config(config.model))
    per_block = 2 * mc.num_key_value_heads * mc.head_dim * target.kv_dtype.itemsize * target.config.kvcache_block_size
    files = [os.path.join(config.model, f) for f in os.listdir(config.model) if f.endswith(".safetensors")]
    return per_block * mc.num_hidden_layers, sum(map(os.path.getsize, files))


class DraftModelProposer:
    def __init__(self, config: SpeculativeConfig, engine: Any) -> None:
        model_config = ModelConfig.from_hf(load_hf_config(config.model))
        if model_config.vocab_size != engine.model_config.vocab_size:
            raise ValueError(f"speculative_config.model has vocab_size {model_config.vocab_size}, the target "
                             f"{engine.model_config.vocab_size}: a draft model must share the target's vocabulary")
        _check_same_tokenizer(load_tokenizer(config.model), engine.tokenizer)
        target = engine.spec
        draft = dataclasses.replace(
            target.config, model=str(config.model), dtype=str(target.dtype).removeprefix("torch."),
            max_model_len=target.max_model_len, num_kvcache_blocks=engine.runner.num_kvcache_blocks,
            speculative_config=None, async_scheduling=False,
        )
        self.runner = ModelRunner(resolve_spec(draft, model_config), model_config)
        self.block_size = target.config.kvcache_block_size

    @torch.inference_mode()
    def propose(self, out: SchedulerOutput) -> torch.Tensor | None:
        """Fill the drafts of the decoding sequences in `out`; returns their (B, K, vocab) distributions, in order."""
        seqs = [(seq, room) for seq, num_new in out.scheduled if (room := lookahead_room(seq, num_new)) > 0]
        if not seqs:
            return None
        chunks = [(seq.token_ids[start:], start, seq.block_table) for seq, _ in seqs
                  for start in [self._valid_draft_kv(seq)]]
        logits = self._logits(chunks)  # (B, vocab): the distributions of each sequence's first draft
        batch = self._batch([seq for seq, _ in seqs], logits.device)
        k = max(room for _, room in seqs)
        probs = torch.zeros(len(seqs), k, logits.shape[1], device=logits.device)
        drafts = torch.zeros(len(seqs), k, dtype=torch.int64, device=logits.device)
        for i in range(k):
            probs[:, i], drafts[:, i] = self._draw(logits, batch, i)
            # the next distributions, of the sequences with room for another draft: draft i's KV goes at position
            # num_tokens + i, inside the blocks the scheduler granted only while i + 1 < room (rows past: unread)
            rows = [b for b, (_, room) in enumerate(seqs) if room > i + 1]
            if rows:
                logits[rows] = self._logits([([int(drafts[b, i])], seqs[b][0].num_tokens + i, seqs[b][0].block_table)
                                             for b in rows])
        for (seq, room), row in zip(seqs, drafts.tolist()):
            seq.draft_tokens = row[:room]
            seq.draft_state = (seq.num_tokens, seq.num_preemptions)  # its tokens' draft KV is written (not the drafts')
        return probs

    def _valid_draft_kv(self, seq: Sequence) -> int:
        count, preemptions = seq.draft_state
        return count if preemptions == seq.num_preemptions else 0

    def _logits(self, chunks: list[tuple[list[int], int, Any]]) -> torch.Tensor:
        step = chunks_step(chunks, self.block_size)
        return self.runner.model.compute_logits(self.runner.compute_hidden(step)).float()

    def _batch(self, seqs: list[Sequence], device: torch.device) -> SamplingBatch:
        temperature, top_k, top_p, seeds = zip(*[(r[1], r[2], r[3], r[4] ^ DRAFT_SEED_SALT)
                                                  for r in (s.sampling_row for s in seqs)])
        return SamplingBatch(
            torch.tensor(temperature, device=device), torch.tensor(top_k, device=device),
            torch.tensor(top_p, device=device), torch.tensor(seeds, device=device),
            torch.tensor([s.num_tokens for s in seqs], device=device),
            needs_filter=any(k > 0 for k in top_k) or any(p < 1 for p in top_p))

    def _draw(self, logits: torch.Tensor, batch: SamplingBatch, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft i of every sequence and its distribution (B, vocab)."""
        at = dataclasses.replace(batch, counters=batch.counters + i)
        scores = apply_warpers(logits, at.temperature, at.top_k if at.needs_filter else None, at.top_p)
        return scores.softmax(dim=-1), sample(logits, at, self.runner.use_kernels)[0]

    def shutdown(self) -> None:
        self.runner.shutdown()


def _check_same_tokenizer(draft: Any, target: Any) -> None:
    """A draft's token ids must mean the target's: the same vocabulary (where both checkpoints have a tokenizer)."""
    if draft is not None and target is not None and draft.get_vocab() != target.get_vocab():
        raise ValueError("speculative_config.model has another tokenizer's vocabulary than the target: a draft model "
                         "must share the target's tokenizer")
