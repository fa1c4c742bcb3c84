"""Async scheduling (engine/overlap.py: Overlap, OverlapScheduler, gather_rows; ModelRunner.launch): the step after the
one in flight (decode, prefill chunks, or both) is scheduled and launched before that step's tokens are known, the
input ids of rows continuing from them taken on the device. It must change nothing a user sees: the same tokens,
texts and finish reasons as the synchronous engine, with rows finishing (stop tokens, stop strings, length limits
up to max_model_len, max_tokens=1 on the prefill's own sample) while a step behind them is in flight, chunked
prefill mixed with decodes, prefix caching, n > 1, sampling with seeds, preemption, and aborts between steps.
"""

from __future__ import annotations

import random

import pytest

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.engine.model_runner import ModelRunner
from nanovllm_ref.engine.overlap import OverlapScheduler

from ..conftest import QWEN3


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 200) for _ in range(rng.randint(3, 40))] for _ in range(n)]


def _run(path: str, async_scheduling: bool | None, prompts, params, monkeypatch: pytest.MonkeyPatch, full: bool = False,
         **kw):
    """(token ids and finish reason per prompt (`full`: token ids, text, finish and stop reason per sample),
    [(launched ahead, with rows dropped, widest block table, a step with prefill chunks fed on the device)])."""
    ahead = []
    original = ModelRunner.launch

    def spy(self, step, prev=None, rows=None, **kw):
        fed = step.num_tokens - len(step.input_ids)  # rows whose input ids are taken from `prev` on the device
        assert (prev is None) == (rows is None) and (rows is None or len(rows) == step.num_tokens)
        dropped = fed and fed < len(prev.step.sample_seq_ids)  # rows that finished in `prev`
        ahead.append((prev is not None, dropped, step.block_tables.shape[1],
                      fed > 0 and step.max_query_len > 1))  # (a step with prefill chunks fed on the device)
        return original(self, step, prev, rows, **kw)

    with monkeypatch.context() as m:
        m.setattr(ModelRunner, "launch", spy)
        # the CPU engine (these are the CPU's defaults, on any machine)
        with LLM(path, dtype="float32", async_scheduling=async_scheduling, **{"device": "cpu", **kw}) as llm:
            outs = llm.generate(prompts, params, use_tqdm=False)
    if full:
        return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs], ahead
    return [(o.token_ids, o.finish_reason) for o in outs], ahead


def _ahead(llm: LLM):
    """The step scheduled behind the one in flight (None also under synchronous scheduling)."""
    return llm.engine.overlap and llm.engine.overlap.ahead


def _params_with_stops(reference: list[tuple[list[int], str]]) -> list[SamplingParams]:
    """Greedy and seeded-sampling requests of different lengths; some stop on a token the plain run produced
    mid-way (so they finish on a stop token while the step behind them is already in flight)."""
    params = []
    for i, (tokens, _) in enumerate(reference):
        stop = [tokens[len(tokens) // 2]] if i % 3 == 0 and len(tokens) > 4 else []
        temperature = 0.0 if i % 2 else 0.8
        params.append(SamplingParams(max_tokens=len(tokens), temperature=temperature, seed=100 + i,
                                     stop_token_ids=stop, ignore_eos=True))
    return params


@pytest.fixture(scope="module")
def path() -> str:
    from golden.load import checkpoint_path

    return str(checkpoint_path(QWEN3))


def test_async_matches_sync_with_stops_lengths_and_sampling(path, monkeypatch):
    prompts = _prompts(12, seed=1)
    rng = random.Random(2)
    base = [SamplingParams(max_tokens=rng.randint(1, 30), temperature=0.8, seed=i, ignore_eos=True)
            for i in range(12)]
    reference, _ = _run(path, False, prompts, base, monkeypatch)
    params = _params_with_stops(reference)
    sync, none = _run(path, False, prompts, params, monkeypatch)
    got, ahead = _run(path, True, prompts, params, monkeypatch)
    assert not any(p for p, *_ in none)
    assert got == sync
    assert any(reason == "stop" for _, reason in sync) and any(reason == "length" for _, reason in sync)
    assert sum(p for p, *_ in ahead) > 5, "no step was launched ahead"
    assert any(r for _, r, *_ in ahead), "no step was launched ahead of one whose rows finished"


def test_async_scheduling_by_default_only_on_cuda(path, monkeypatch):
    """On the CPU the host and the model share the cores: nothing would overlap, so the default runs every step
    synchronously (asking for async scheduling, as the tests here do, still gets it)."""
    prompts = _prompts(3, seed=3)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    behind, original = [], OverlapScheduler.take_in_flight
    monkeypatch.setattr(OverlapScheduler, "take_in_flight", lambda self, out: behind.append(out) or original(self, out))
    default, _ = _run(path, None, prompts, params, monkeypatch)
    assert behind == [], "the CPU default scheduled steps behind the one in flight"
    assert default == _run(path, True, prompts, params, monkeypatch)[0] and behind


def test_async_at_max_model_len_and_under_preemption(path, monkeypatch):
    # requests that run into max_model_len (a row finishing in the step in flight computes one token more in
    # the step behind it: still inside max_model_len) and a KV cache so small that decodes preempt each other
    prompts = _prompts(6, seed=4)
    params = [SamplingParams(max_tokens=64 - len(p), temperature=0.0, ignore_eos=True) for p in prompts]
    kw = dict(max_model_len=64, num_kvcache_blocks=12, max_num_seqs=4)
    sync, _ = _run(path, False, prompts, params, monkeypatch, **kw)
    got, ahead = _run(path, True, prompts, params, monkeypatch, **kw)
    assert got == sync
    assert all(len(p) + len(t) == 64 for p, (t, _) in zip(prompts, got))
    assert max(w for _, _, w, _ in ahead) <= 64 // 16, "a block table grew past max_model_len"
    assert sum(p for p, *_ in ahead) > 5


def test_abort_while_a_step_is_in_flight(path):
    prompts = _prompts(4, seed=5)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)

    def run(async_scheduling: bool):
        with LLM(path, dtype="float32", async_scheduling=async_scheduling) as llm:
            ids = [llm.add_request(p, params) for p in prompts]
            results = {}
            for i in range(40):
                if i == 6:
                    aborted = llm.engine.abort_request(ids[1])
                    results[aborted.request_id] = aborted
                for out in llm.step():
                    results[out.request_id] = out
                if not llm.engine.has_unfinished():
                    break
            assert not llm.engine.has_unfinished() and _ahead(llm) is None
            return [(results[i].token_ids, results[i].finish_reason) for i in ids]

    sync, got = run(False), run(True)
    assert got == sync
    assert got[1][1] == "abort" and 0 < len(got[1][0]) < 24


def test_aborting_the_last_request_leaves_nothing_in_flight(path):
    with LLM(path, dtype="float32", async_scheduling=True) as llm:
        rid = llm.add_request([5, 6, 7], SamplingParams(max_tokens=20, ignore_eos=True))
        for _ in range(4):
            llm.step()
        assert _ahead(llm) is not None  # a steady decode: the next step is already launched
        assert llm.engine.abort_request(rid).finish_reason == "abort"
        assert _ahead(llm) is None and not llm.engine.has_unfinished()
        rid = llm.add_request([8, 9], SamplingParams(max_tokens=3, ignore_eos=True))  # the engine serves on
        outs = [o for _ in range(10) for o in llm.step() if o.finished]
        assert [len(o.token_ids) for o in outs if o.request_id == rid] == [3]


def _mixed_requests(path: str, monkeypatch) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of 3-90 tokens (some sharing a 40-token prefix) and per-request settings: greedy and seeded sampling,
    n = 3, max_tokens = 1, a stop token that is the request's first sample (it finishes on its prefill's sample, as
    with EOS), a stop string, different lengths."""
    rng = random.Random(7)
    shared = [rng.randrange(2, 200) for _ in range(40)]
    prompts = [[rng.randrange(2, 200) for _ in range(rng.randint(3, 90))] for _ in range(10)]
    prompts += [shared + [rng.randrange(2, 200) for _ in range(rng.randint(1, 20))] for _ in range(4)]
    first, _ = _run(path, False, prompts, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                    monkeypatch, full=True)
    params = []
    for i, [(tokens, text, _, _)] in enumerate(first):
        kw = dict(max_tokens=4 + 3 * (i % 5), ignore_eos=True, temperature=0.0 if i % 2 else 0.9, seed=10 + i)
        if i == 1:
            kw["max_tokens"] = 1
        elif i == 3:
            kw["stop_token_ids"] = [tokens[0]]  # greedy: its first token, sampled in its (last) prefill step
        elif i == 4:
            kw["n"] = 3
        elif i == 5:  # greedy: a stop string that its 6-token text holds past its first characters
            kw.update(stop=[text[2:4]], ignore_eos=False)
        params.append(SamplingParams(**kw))
    return prompts, params


@pytest.mark.parametrize("setting", [
    dict(max_num_batched_tokens=24, max_num_seqs=6),  # chunks of long prompts next to other sequences' decodes
    dict(max_num_batched_tokens=32, num_kvcache_blocks=12, max_model_len=128),  # preemption under chunked prefill
    dict(max_num_batched_tokens=17, enable_prefix_caching=False),
], ids=["chunked-mixed", "preemption", "no-prefix-cache"])
def test_async_prefill_and_mixed_steps_match_sync(path, monkeypatch, setting):
    prompts, params = _mixed_requests(path, monkeypatch)
    counts = {}

    def run(async_scheduling: bool):
        with monkeypatch.context() as m:
            preemptions = []
            original = LLM.__exit__
            m.setattr(LLM, "__exit__", lambda llm, *a: preemptions.append(llm.engine.scheduler.num_preemptions)
                      or original(llm, *a))
            got = _run(path, async_scheduling, prompts, params, m, full=True, **setting)
        counts[async_scheduling] = preemptions[0]
        return got

    sync, _ = run(False)
    got, ahead = run(True)
    assert got == sync
    assert len(got[1][0][0]) == 1 and len(got[4]) == 3
    assert got[3][0][2:] == ("stop", got[3][0][0][0]) and len(got[3][0][0]) == 1  # stopped on its prefill's sample
    assert got[5][0][2:] == ("stop", params[5].stop[0])
    assert sum(chunked for *_, chunked in ahead) >= 3, "no step with prefill chunks was fed on the device"
    if "num_kvcache_blocks" in setting:
        assert counts[True] > 0 and counts[False] > 0, "the small KV cache should have forced preemptions"


def test_abort_while_a_prefill_step_is_in_flight(path):
    prompts = _prompts(6, seed=9) + [list(range(2, 90))]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    def run(async_scheduling: bool):
        with LLM(path, dtype="float32", async_scheduling=async_scheduling, max_num_batched_tokens=20) as llm:
            ids = [llm.add_request(p, params) for p in prompts]
            results, general_ahead = {}, False
            for i in range(200):
                if i == 3:
                    ahead = _ahead(llm)
                    general_ahead = ahead is not None and any(n > 1 for _, n in ahead[0].scheduled)
                    for rid in (ids[-1], ids[0]):  # the long prompt, mid-prefill, and a decoding request
                        results[rid] = llm.engine.abort_request(rid)
                for out in llm.step():
                    results[out.request_id] = out
                if not llm.engine.has_unfinished():
                    break
            assert not llm.engine.has_unfinished() and _ahead(llm) is None
            return [(results[i].token_ids, results[i].finish_reason) for i in ids], general_ahead

    (sync, _), (got, general_ahead) = run(False), run(True)
    assert general_ahead, "no prefill step was in flight behind another when the requests were aborted"
    assert got == sync
    assert got[-1][1] == "abort" and got[0][1] == "abort"
