"""Engine safety behind the server and `LLM.generate` alike: integer fields range-checked at add time (seeds to
64 bits, top_k and token ids to the vocabulary), and an exception inside a step fails only that step's requests
while the engine goes on serving."""

from __future__ import annotations

import pytest

from nanovllm_ref import LLM, SamplingParams

from ..conftest import QWEN3, checkpoint_path

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    with LLM(str(checkpoint_path(QWEN3)), dtype="float32", max_model_len=256) as llm:
        yield llm


@pytest.fixture(scope="module")
def reference(llm):
    return llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids


OUT_OF_RANGE = {
    "seed 2**64": (dict(seed=2**64), r"seed must be an int in \[-9223372036854775808, 18446744073709551615\]"),
    "seed -2**63 - 1": (dict(seed=-(2**63) - 1), r"seed must be an int in \[-9223372036854775808, "),
    "top_k 2**70": (dict(top_k=2**70), "top_k"),
    "top_k over the vocabulary": (dict(top_k=1537), "top_k must be <= the vocabulary size 1536"),
    "stop token 2**70": (dict(stop_token_ids=[2**70]), "stop_token_ids"),
    "stop token = vocab": (dict(stop_token_ids=[1536]), r"outside the vocabulary \[0, 1536\)"),
}


@pytest.mark.parametrize("case", list(OUT_OF_RANGE))
def test_out_of_range_integers_are_refused_before_the_engine_changes(llm, reference, case):
    kwargs, words = OUT_OF_RANGE[case]
    with pytest.raises(ValueError, match=words):
        llm.generate([[5, 6, 7], [8, 9]], [GREEDY, SamplingParams(max_tokens=2, **kwargs)], use_tqdm=False)
    assert not llm.has_unfinished()
    assert llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids == reference


def test_64_bit_seeds_at_both_ends_are_served(llm):
    outs = {}
    for seed in (2**63 - 1, -(2**63), 0, 2**64 - 1, -1):
        out = llm.generate([[5, 6]], SamplingParams(seed=seed, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
        assert len(out.token_ids) == 8 and out.finish_reason == "length"
        outs[seed] = out.token_ids
    assert outs[2**64 - 1] == outs[-1]  # an unsigned seed is its two's-complement int64
    assert llm.generate([[5, 6]], SamplingParams(top_k=1536, max_tokens=2, ignore_eos=True), use_tqdm=False)


def _fail_next_execute(llm, message: str) -> None:
    """The next step the runner launches (every step, prefill, decode or behind one in flight) raises."""
    runner = llm.engine.runner

    def broken(*args, **kwargs):
        del runner.launch  # the class's method again
        raise RuntimeError(message)

    runner.launch = broken


def test_a_failing_step_fails_only_its_requests():
    with LLM(str(checkpoint_path(QWEN3)), dtype="float32", max_model_len=256, max_num_seqs=1) as llm:
        reference = llm.generate([[9, 8, 7]], GREEDY, use_tqdm=False)[0].token_ids
        first = llm.add_request([5, 6, 7], GREEDY)
        waiting = llm.add_request([9, 8, 7], GREEDY)  # max_num_seqs=1: not in the first step
        _fail_next_execute(llm, "injected")
        failed = [o for o in llm.step() if o.finished]
        assert [(o.request_id, o.finish_reason) for o in failed] == [(first, "error")]
        assert "injected" in failed[0].error and "RuntimeError" in failed[0].error
        outs = []
        while llm.has_unfinished():
            outs += [o for o in llm.step() if o.finished]
        assert [(o.request_id, o.token_ids) for o in outs] == [(waiting, reference)]
        assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
        _fail_next_execute(llm, "again")  # through generate: those requests come back failed, the call returns
        outs = llm.generate([[1, 2], [3, 4]], GREEDY, use_tqdm=False)
        assert [o.finish_reason for o in outs] == ["error", "length"]
        assert llm.generate([[9, 8, 7]], GREEDY, use_tqdm=False)[0].token_ids == reference


def test_a_failing_decode_step_launched_ahead_fails_its_requests():
    with LLM(str(checkpoint_path(QWEN3)), dtype="float32", max_model_len=256, async_scheduling=True) as llm:
        reference = llm.generate([[5, 6, 7], [9, 9]], GREEDY, use_tqdm=False)
        rids = [llm.add_request(p, GREEDY) for p in ([5, 6, 7], [9, 9])]
        llm.step()  # prefill; the decodes after it go through the async path
        runner = llm.engine.runner
        original = runner.collect

        def broken(*args, **kwargs):
            runner.collect = original
            raise RuntimeError("collect failed")

        runner.collect = broken
        outs = []
        while llm.has_unfinished():
            outs += [o for o in llm.step() if o.finished]
        assert sorted((o.request_id, o.finish_reason) for o in outs) == [(r, "error") for r in sorted(rids)]
        assert llm.engine.overlap.ahead is None and not llm.engine.requests
        again = llm.generate([[5, 6, 7], [9, 9]], GREEDY, use_tqdm=False)
        assert [o.token_ids for o in again] == [o.token_ids for o in reference]
