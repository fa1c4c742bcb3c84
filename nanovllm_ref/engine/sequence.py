"""A request's state inside the engine (pure Python, no torch).

One notion of progress: `num_computed_tokens` counts tokens whose KV is in the cache. Prefill, chunked
prefill, decode and recompute after preemption differ only in how many new tokens the scheduler grants.
"""

from __future__ import annotations

import itertools
from array import array
from enum import Enum

from ..sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    _ids = itertools.count()
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, seed: int) -> None:
        self.seq_id = next(Sequence._ids)  # also the arrival order
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.seed = seed  # params.seed, or one drawn by the engine: every request samples from its own stream
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at first admission
        self.num_preemptions = 0
        self.block_table = array("i")  # an array: a step's tables join as one buffer (inputs.py)
        self.block_hashes: list[int] = []  # chained hashes of the full, computed blocks, in order
        self.draft_tokens: list[int] = []  # speculative proposals this step verifies (proposers.py), after token_ids
        self.num_draft_tokens = self.num_accepted_tokens = 0  # speculative decoding's counts (observers.py)
        self.draft_state = (0, 0)  # a draft model's KV: (tokens it holds, num_preemptions then) (draft_model.py)
        # What the per-step loops need, computed once: the tokens that end the request (the scheduler adds
        # eos) and its length limit (capped by max_model_len there), and this request's sampling row.
        self.stop_ids = frozenset(params.stop_token_ids)
        self.max_num_tokens = self.num_prompt_tokens + params.max_tokens
        self.sampling_row = (
            self.seq_id, float(params.temperature), params.top_k, float(params.top_p), seed,
            -1 if params.logprobs is None else params.logprobs,
        )
        self.needs_processing = params.needs_logits_processing
        self.detokenizer = None  # an IncrementalDetokenizer when the request has stop strings (set by the engine)
        self.stop_reason: int | str | None = None  # the stop token or stop string that ended it
        self.prefill_after: Sequence | None = None  # a sibling (same prompt, n > 1) whose prefill it waits for
        self.group: list[Sequence] | None = None  # the n samples of its request, itself included (n > 1)
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            [None] if params.prompt_logprobs is not None else None
        )

    @property
    def num_tokens(self) -> int:  # the next position to compute is below it (overlap.py counts one in flight too)
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def uses_prefix_cache(self) -> bool:
        # Prompt logprobs need the logits of every prompt position, so such requests compute them all.
        return self.params.prompt_logprobs is None

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table.tolist()})"
        )
