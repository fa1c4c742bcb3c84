"""The engine's structured-output component (vLLM v1's StructuredOutputManager, vllm/v1/structured_output/): one
xgrammar GrammarMatcher per constrained sequence, and each step's packed token bitmask of its sampling rows.

The engine compiles a request's spec when it validates it (`compile`: the compile cache, compiler.py), adds one
matcher per sequence (each sample of n its own) when it adds the request, releases it when the sequence finishes, and
right after `prepare_step` asks for the bitmask of the step's structured sampling rows (`bitmask`), which goes into
the StepInput as plain numpy (it is pickled to tensor-parallel workers) and is applied on rank 0 before anything
else reads the logits (kernels/token_bitmask.py).

A row's mask is derived from that row's own tokens (`ProcessedRow.token_ids`), never from which rows came before:
the matcher remembers the output tokens it accepted (`consumed`); for a row it rolls back to the longest common
prefix of those and the row's output tokens, and accepts the rest. So a sequence may have several rows in a step
(speculative decoding: row i verifies draft token i, its token_ids the sequence's tokens plus i drafts) and drafts
may be rejected afterwards (the next step's row is shorter: rolled back), and preemption and recompute change
nothing (the tokens are the same). A token the grammar refuses (a draft the target will reject) stops the
acceptance there: that row, and the sequence's later rows in the step, get the mask of the last state reached.

Stop tokens: the matcher's stop tokens are the request's (EOS and stop_token_ids; the engine's EOS ids where those
are empty, ignore_eos), so the grammar allows them exactly where it may end, and only them once it has ended; a
mask that would allow nothing allows them (never an all-zero row).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..sampling_params import ProcessedRow, StructuredOutputsParams
from .compiler import Grammars

MAX_REDRAFT = 64  # a sequence's tokens never change further back than this from the end (drafts are shorter)


@dataclass
class _Tracked:
    matcher: Any  # xgrammar.GrammarMatcher
    stop_ids: list[int]
    consumed: list[int] = field(default_factory=list)  # the output tokens the matcher accepted, in order


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.eos_ids = sorted(eos_ids)
        self.words = -(-vocab_size // 32)  # int32 words per bitmask row
        self._grammars: Grammars | None = None  # built on the first structured request (imports xgrammar)
        self._lock = threading.Lock()
        self._tracked: dict[int, _Tracked] = {}  # seq_id -> its matcher

    @property
    def grammars(self) -> Grammars:
        with self._lock:
            if self._grammars is None:
                self._grammars = Grammars(self.tokenizer, self.vocab_size, self.eos_ids)
            return self._grammars

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar (cached); raises ValueError naming the field for an invalid spec."""
        return self.grammars.compile(spec)

    def add(self, seq_id: int, spec: StructuredOutputsParams, stop_ids: frozenset[int]) -> None:
        """A matcher for a sequence, whose request's stop tokens end the grammar."""
        stops = sorted(stop_ids) or self.eos_ids
        xgr = self.grammars.xgr
        self._tracked[seq_id] = _Tracked(xgr.GrammarMatcher(self.compile(spec), override_stop_tokens=stops or None),
                                         stops)

    def release(self, seq_id: int) -> None:
        self._tracked.pop(seq_id, None)

    @property
    def num_tracked(self) -> int:
        return len(self._tracked)

    def bitmask(self, rows: list[ProcessedRow]) -> tuple[np.ndarray, list[int]] | None:
        """((m, ceil(vocab / 32)) int32 allowed-token bits (token v: bit v % 32 of word v // 32), the m structured rows'
        indices among the step's sampling rows), or None when no row is structured."""
        rows = [r for r in rows if r.params.structured_outputs is not None]
        if not rows:
            return None
        mask = torch.full((len(rows), self.words), -1, dtype=torch.int32)  # (xgrammar fills torch tensors)
        for i, row in enumerate(rows):
            tracked = self._tracked.get(row.seq_id)
            if tracked is None:  # (a sequence added without `add`: its matcher from the row)
                self.add(row.seq_id, row.params.structured_outputs, row.stop_ids)
                tracked = self._tracked[row.seq_id]
            self._fill(tracked, row, mask, i)
        return mask.numpy(), [r.row for r in rows]

    def _fill(self, tracked: _Tracked, row: ProcessedRow, mask: torch.Tensor, i: int) -> None:
        follow(tracked, row.token_ids, row.num_prompt_tokens)
        if tracked.matcher.is_terminated():  # (it accepted a stop token: ignore_eos goes on past it)
            _only(mask, i, tracked.stop_ids)
            return
        tracked.matcher.fill_next_token_bitmask(mask, i)
        if not mask[i].any():
            _only(mask, i, tracked.stop_ids)


def follow(tracked: _Tracked, token_ids: list[int], num_prompt_tokens: int) -> bool:
    """Bring the matcher to the output tokens token_ids[num_prompt_tokens:]: roll back to the common prefix with what it
    consumed, accept the rest; False if the grammar refused one (the matcher stays at the last state reached)."""
    consumed, matcher = tracked.consumed, tracked.matcher
    num_out = len(token_ids) - num_prompt_tokens
    same = min(len(consumed), num_out)
    for j in range(max(0, same - MAX_REDRAFT), same):  # (older tokens never change)
        if consumed[j] != token_ids[num_prompt_tokens + j]:
            same = j
            break
    if same < len(consumed):
        matcher.rollback(len(consumed) - same)
        del consumed[same:]
    for token in token_ids[num_prompt_tokens + same:]:
        if matcher.is_terminated() or not matcher.accept_token(token):
            return False
        consumed.append(token)
    return True


def _only(mask: torch.Tensor, i: int, ids: list[int]) -> None:
    """Row i of the bitmask allows exactly `ids` (all tokens when there are none: nothing to end on)."""
    if not ids:
        mask[i] = -1
        return
    words = np.zeros(mask.shape[1], np.int64)
    for t in ids:
        words[t // 32] |= 1 << (t % 32)
    mask[i] = torch.from_numpy(words.astype(np.uint32).view(np.int32))
