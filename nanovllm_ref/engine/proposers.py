"""Speculative proposers: fill `seq.draft_tokens` of the step's decoding sequences within the room the scheduler
granted them (Scheduler's lookahead), and trim each grant to what was proposed.

- `NgramProposer` (prompt lookup decoding, Saxena 2023; vLLM's `method="ngram"`): the tokens that followed the
  latest earlier occurrence of the sequence's last n tokens, for the longest n in [prompt_lookup_min,
  prompt_lookup_max] that occurs. Pure Python and numpy.
- `DraftModelProposer` (draft_model.py): a smaller checkpoint with the same tokenizer proposes autoregressively.

`propose(out)` returns what the verification needs beyond the drafts: None, or the (B, K, vocab) distributions a
draft model drew them from (verify.py).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..config import RunnerSpec
from ..speculative import SpeculativeConfig
from .scheduler import SchedulerOutput, lookahead_room


def trim_grants(out: SchedulerOutput) -> None:
    """Shrink each decoding sequence's grant to its last token and the drafts it got."""
    for i, (seq, num_new) in enumerate(out.scheduled):
        room = lookahead_room(seq, num_new)
        if room > len(seq.draft_tokens):
            out.scheduled[i] = (seq, num_new - room + len(seq.draft_tokens))


def ngram_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens after the latest earlier occurrence of the last n tokens, the longest n in [min_n, max_n] that
    occurs; [] if none does."""
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, len(arr) - 1), min_n - 1, -1):
        # start positions 0 .. len - n - 1: every occurrence but the suffix itself, each followed by a token
        windows = sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return arr[start : start + k].tolist()
    return []


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, out: SchedulerOutput) -> None:
        for seq, num_new in out.scheduled:
            room = lookahead_room(seq, num_new)
            if room > 0:
                seq.draft_tokens = ngram_lookup(seq.token_ids, room, self.min_n, self.max_n)
        trim_grants(out)
        return None

    def shutdown(self) -> None:
        pass  # (nothing held)


def draft_reserve_of(config: SpeculativeConfig | None, target: RunnerSpec) -> tuple[int, int]:
    """The memory a draft model needs beside the target's budget (draft_model.py), (0, 0) without one."""
    if config is None or config.method != "draft_model":
        return 0, 0
    from .draft_model import draft_reserve

    return draft_reserve(config, target)


def make_proposer(config: SpeculativeConfig, engine: object) -> NgramProposer:
    """The proposer of `config.method` (a draft model's is built beside the engine's runner)."""
    if config.method == "ngram":
        return NgramProposer(config)
    from .draft_model import DraftModelProposer

    return DraftModelProposer(config, engine)
