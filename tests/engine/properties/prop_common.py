"""Shared pieces of the property tests: tagged assertions, strategies, and the fake model.

Every invariant failure raises `AssertionError("[tag] ...")`, so a bite test can assert that the
invariant it targets (and not some other one) is the one that caught the deliberate bug.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TypeVar

import xxhash
from hypothesis import strategies as st

from nanovllm_ref.engine.sequence import Sequence
from nanovllm_ref.sampling_params import SamplingParams

VOCAB = 8  # the fake model's vocabulary: output tokens are 0..7
F = TypeVar("F", bound=Callable)
EOS = 7  # the fake model's end-of-sequence token
PROMPT_TOKENS = st.integers(0, 3)  # a tiny alphabet makes shared prefixes (and prefix-cache hits) common


def check(cond: bool, tag: str, msg: str = "") -> None:
    """Assert an invariant; the tag names it in the error message."""
    if not cond:
        raise AssertionError(f"[{tag}] {msg}")


def name(seq: Sequence) -> str:
    """A short, per-test-run name for a sequence (its request id; seq_ids are global and large)."""
    return seq.request_id


def describe(seq: Sequence) -> str:
    return f"{name(seq)}(tokens={seq.token_ids}, computed={seq.num_computed_tokens}, blocks={seq.block_table})"


def rarely(num_values: int, percent: int) -> st.SearchStrategy[int | None]:
    """None most of the time, else one of 0..num_values-1 (`percent`% of draws); shrinks towards None."""
    cut = 100 - percent
    return st.integers(0, 99).map(lambda x: None if x < cut else (x - cut) % num_values)


def build_prompt(history: list[tuple[int, ...]], reuse: int | None, cut: int, extra: list[int]) -> list[int]:
    """A prompt: optionally a prefix (`cut` tokens) of an earlier token list, then `extra` tokens."""
    base = list(history[reuse % len(history)][:cut]) if reuse is not None and history else []
    return base + list(extra) or [0]


def fake_next_token(seed: int, context: Seq[int]) -> int:
    """The fake model: a deterministic function of the request's seed and the KV context it attends to."""
    return xxhash.xxh3_64_intdigest(array("q", context).tobytes(), seed=seed) % VOCAB


def is_stop(token: int, params: SamplingParams, eos: frozenset[int]) -> bool:
    return (not params.ignore_eos and token in eos) or token in params.stop_token_ids


def reference_output(prompt: list[int], params: SamplingParams, seed: int, eos: frozenset[int]) -> list[int]:
    """What the request must produce: the fake model run alone, token by token, until stop or max_tokens."""
    tokens, out = list(prompt), []
    while True:
        token = fake_next_token(seed, tokens)
        tokens.append(token)
        out.append(token)
        if is_stop(token, params, eos) or len(out) >= params.max_tokens:
            return out


def guarded(method: F) -> F:
    """Mark the state machine unclean when a rule or invariant raises, so teardown skips its drain."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self.clean = False
            raise

    return wrapper  # type: ignore[return-value]
