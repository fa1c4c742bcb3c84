"""Soak: a Hypothesis state machine drives the real engine (tiny model, CPU) with random adds,
aborts and steps under mixed sampling params and a small KV cache. After every step no block leaks, and
every finished greedy request equals what it produces when run alone."""

from __future__ import annotations

import functools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nanovllm_ref import LLM, SamplingParams

from ..conftest import QWEN3, checkpoint_path

PREFIX = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28]  # > one block: prefix hits


def _new_engine() -> LLM:
    return LLM(str(checkpoint_path(QWEN3)), dtype="float32", num_kvcache_blocks=12, max_model_len=96,
               max_num_batched_tokens=24, max_num_seqs=4)


@functools.lru_cache(maxsize=1)
def _alone_engine() -> LLM:
    return _new_engine()


@functools.cache
def _alone(prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    llm = _alone_engine()  # its own engine: generate() drives every request of the engine it runs on
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate([list(prompt)], params, use_tqdm=False)[0].token_ids


class EngineSoak(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.llm = _new_engine()  # fresh per example: no state leaks between examples
        self.live: dict[str, tuple[tuple[int, ...], SamplingParams]] = {}

    @rule(
        shared=st.booleans(),
        suffix=st.lists(st.integers(3, 200), min_size=1, max_size=30),
        max_tokens=st.integers(1, 12),
        mode=st.sampled_from(["greedy", "sampled", "topk", "logprobs"]),
    )
    def add(self, shared, suffix, max_tokens, mode):
        prompt = tuple((PREFIX if shared else []) + suffix)
        params = {
            "greedy": SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
            "sampled": SamplingParams(temperature=1.0, seed=7, max_tokens=max_tokens, ignore_eos=True),
            "topk": SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_tokens=max_tokens, ignore_eos=True),
            "logprobs": SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=3,
                                       prompt_logprobs=2),
        }[mode]
        rid = self.llm.add_request(list(prompt), params)
        self.live[rid] = (prompt, params)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 100))
    def abort(self, pick):
        rid = sorted(self.live)[pick % len(self.live)]
        out = self.llm.abort_request(rid)
        assert out is not None and out.finish_reason == "abort"
        del self.live[rid]

    @precondition(lambda self: self.llm.has_unfinished())
    @rule()
    def step(self):
        for out in (o for o in self.llm.step() if o.finished):
            prompt, params = self.live.pop(out.request_id)
            assert out.finish_reason == "length" and len(out.token_ids) == params.max_tokens
            if params.temperature == 0:
                assert out.token_ids == _alone(prompt, params.max_tokens), f"request {out.request_id} differs"
            if params.logprobs is not None:
                assert len(out.logprobs) == params.max_tokens and len(out.prompt_logprobs) == len(prompt)

    @invariant()
    def no_block_leaks(self):
        engine = self.llm.engine
        bm = engine.block_manager
        held = [b for seq in engine.scheduler.running for b in seq.block_table]
        assert len(set(held)) + bm.num_free_blocks == bm.num_blocks
        refs = {}
        for b in held:
            refs[b] = refs.get(b, 0) + 1
        assert all(bm.blocks[b].ref_count == n for b, n in refs.items())
        assert all(not seq.block_table for seq in engine.scheduler.waiting)

    def teardown(self):
        for rid in list(self.live):
            self.llm.abort_request(rid)
        bm = self.llm.engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks


EngineSoak.TestCase.settings = settings(
    settings.default, max_examples=max(5, settings.default.max_examples // 4), stateful_step_count=25
)
test_engine_soak = EngineSoak.TestCase
