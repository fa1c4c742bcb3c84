"""`LLMEngine.step()`'s per-step outputs (vLLM's RequestOutputKind): every request that advanced gets one, shaped by
its output kind; DELTA outputs join (text, token ids, logprobs) to the final output, CUMULATIVE ones grow into it,
FINAL_ONLY gives just the final one; a possible stop string is held back; n > 1 and abort; and the engine's other
public surface (stats, observers, reset_prefix_cache)."""

from __future__ import annotations

import dataclasses

import pytest

from golden.load import checkpoint_path
from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.outputs import RequestOutput
from nanovllm_ref.sampling_params import RequestOutputKind

from ..conftest import QWEN3

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY
PROMPT = [5, 6, 7, 8, 9, 10]
SAMPLED = SamplingParams(max_tokens=24, temperature=1.0, seed=7, ignore_eos=True, logprobs=2, prompt_logprobs=1)


@pytest.fixture(scope="module")
def llm():
    with LLM(checkpoint_path(QWEN3), dtype="float32", max_model_len=256, kvcache_block_size=16) as llm:
        yield llm


def _run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, list[RequestOutput]]:
    """Every output each request got, step by step (ids in the order added)."""
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    got: dict[str, list[RequestOutput]] = {rid: [] for rid in ids}
    while llm.has_unfinished():
        outs = llm.step()
        assert len({o.request_id for o in outs}) == len(outs), "one output per request per step"
        for out in outs:
            assert not got[out.request_id] or not got[out.request_id][-1].finished, "output after the final one"
            got[out.request_id].append(out)
    assert all(outs and outs[-1].finished for outs in got.values())
    return got


def _joined(outs: list[RequestOutput]) -> RequestOutput:
    joined = RequestOutput(outs[0].request_id, outs[0].prompt_token_ids)
    for out in outs:
        joined.add(out, aggregate=True)
    return joined


def _same(a, b) -> None:
    assert (a.token_ids, a.text, a.logprobs, a.finish_reason, a.stop_reason) == (
        b.token_ids, b.text, b.logprobs, b.finish_reason, b.stop_reason)


def _stop_string(llm: LLM, params: SamplingParams) -> tuple[str, str]:
    """(a stop string spanning several tokens of the request's greedy text, that text)."""
    [plain] = llm.generate([PROMPT], params, use_tqdm=False)
    ids = plain.token_ids
    for i in range(2, len(ids) - 3):
        prefix = llm.tokenizer.decode(ids[:i])
        piece = llm.tokenizer.decode(ids[i:i + 3])
        if len(piece.strip()) >= 3 and plain.text.find(piece) == len(prefix) and prefix.find(piece) < 0:
            return piece, plain.text
    pytest.skip("no stop string candidate in this checkpoint's text")


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_each_kind_ends_on_the_final_output_of_generate(llm, kind):
    params = dataclasses.replace(SAMPLED, output_kind=kind)
    [final] = llm.generate([PROMPT], params, use_tqdm=False)
    [outs] = _run(llm, [PROMPT], [params]).values()
    if kind is FINAL_ONLY:
        assert len(outs) == 1
        _same(outs[0], final)
    elif kind is DELTA:
        assert len(outs) == len(final.token_ids) and all(len(o.token_ids) == 1 for o in outs)
        _same(_joined(outs), final)
        assert outs[0].prompt_logprobs == final.prompt_logprobs and all(o.prompt_logprobs is None for o in outs[1:])
    else:
        for before, after in zip(outs, outs[1:]):
            assert after.token_ids[: len(before.token_ids)] == before.token_ids and after.text.startswith(before.text)
        _same(outs[-1], final)
        assert all(o.prompt_logprobs == final.prompt_logprobs for o in outs)
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]


def test_a_possible_stop_string_is_held_back_and_never_taken_back(llm):
    greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    stop, plain_text = _stop_string(llm, greedy)
    params = dataclasses.replace(greedy, stop=[stop], output_kind=CUMULATIVE)
    [final] = llm.generate([PROMPT], params, use_tqdm=False)
    assert final.finish_reason == "stop" and final.stop_reason == stop
    assert final.text == plain_text[: plain_text.find(stop)]
    [outs] = _run(llm, [PROMPT], [params]).values()
    assert all(final.text.startswith(o.text) for o in outs), "streamed text that the stop string later cut"
    _same(outs[-1], final)
    deltas = next(iter(_run(llm, [PROMPT], [dataclasses.replace(params, output_kind=DELTA)]).values()))
    assert "".join(o.text for o in deltas) == final.text and stop not in final.text
    assert any(not o.text and o.token_ids for o in deltas[:-1]), "nothing was held back while it ran"


def test_n_samples_stream_by_index_and_join_to_generates_samples(llm):
    params = dataclasses.replace(SAMPLED, n=3, max_tokens=12, prompt_logprobs=None)
    [final] = llm.generate([PROMPT], params, use_tqdm=False)
    [outs] = _run(llm, [PROMPT], [dataclasses.replace(params, output_kind=DELTA)]).values()
    for out in outs:
        indices = [c.index for c in out.outputs]
        assert indices == sorted(set(indices)) and out.outputs and (out.token_ids, out.text) == (
            out.outputs[0].token_ids, out.outputs[0].text)
    joined = _joined(outs)
    assert [c.index for c in joined.outputs] == [0, 1, 2]
    for mine, theirs in zip(joined.outputs, final.outputs):
        _same(mine, theirs)
    [cumulative] = _run(llm, [PROMPT], [params]).values()
    last = {c.index: c for out in cumulative for c in out.outputs}
    for i, theirs in enumerate(final.outputs):
        _same(last[i], theirs)


def test_kinds_mixed_in_one_batch_and_generate_takes_final_outputs_whatever_the_kind(llm):
    kinds = [DELTA, FINAL_ONLY, CUMULATIVE]
    params = [dataclasses.replace(SAMPLED, output_kind=k, max_tokens=8 + 4 * i) for i, k in enumerate(kinds)]
    got = list(_run(llm, [PROMPT, [3, 4], [9, 9, 9]], params).values())
    finals = llm.generate([PROMPT, [3, 4], [9, 9, 9]], params, use_tqdm=False)
    assert len(got[1]) == 1 and len(got[0]) == 8 and len(got[2]) == 16
    for outs, kind, final in zip(got, kinds, finals):
        _same(_joined(outs) if kind is DELTA else outs[-1], final)
        assert len(final.token_ids) == len(final.outputs[0].token_ids) and final.finished


def test_abort_gives_the_rest_as_its_final_output(llm):
    params = dataclasses.replace(SAMPLED, max_tokens=50, output_kind=DELTA)
    rid = llm.add_request(PROMPT, params)
    outs = [o for _ in range(3) for o in llm.step()]
    assert len(outs) == 3 and not any(o.finished for o in outs)
    last = llm.abort_request(rid)
    assert last.finished and last.finish_reason == "abort" and last.token_ids == [] and last.text == ""
    joined = _joined([*outs, last])
    assert len(joined.token_ids) == 3 and joined.finish_reason == "abort" and len(joined.logprobs) == 3
    assert llm.abort_request(rid) is None and not llm.has_unfinished() and llm.step() == []


def test_output_kind_is_checked():
    with pytest.raises(ValueError, match="output_kind must be a RequestOutputKind"):
        SamplingParams(output_kind=3)
    assert SamplingParams(output_kind=1).output_kind is DELTA


class _Decisions:
    def __init__(self) -> None:
        self.seen = []

    def on_schedule(self, decision) -> None:
        self.seen.append(decision)


def test_stats_observers_and_reset_prefix_cache(llm):
    assert llm.stats().num_running == llm.stats().num_waiting == 0 and llm.stats().kv_cache_usage == 0.0
    observer = _Decisions()
    llm.engine.add_observer(observer)
    try:
        rids = [llm.add_request(PROMPT, SamplingParams(max_tokens=4, ignore_eos=True)) for _ in range(2)]
        assert llm.stats().num_waiting == 2
        llm.step()
        stats = llm.stats()
        assert stats.num_running == 2 and stats.num_waiting == 0 and 0 < stats.kv_cache_usage <= 1
        first = observer.seen[0]
        assert [s.request_id for s in first.waiting_before] == rids and [s.num_new_tokens for s in first.scheduled]
        assert all(len(s.block_table) == 1 for s in first.running) and first.block_size == 16
        while llm.has_unfinished():
            llm.step()
    finally:
        llm.engine.remove_observer(observer)
    seen = len(observer.seen)
    llm.generate([PROMPT], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(observer.seen) == seen and llm.stats().num_running == 0
    llm.reset_prefix_cache()
    [out] = llm.generate([PROMPT * 3], SamplingParams(max_tokens=2), use_tqdm=False)
    assert out.num_cached_tokens == 0


def test_delta_outputs_under_async_scheduling_match_the_plain_loops(llm):
    """The step scheduled ahead of the one in flight (async scheduling) adds no output of its own: a request's
    DELTA outputs carry each token once, in order, as the plain loop's do."""
    prompts = [PROMPT, [3, 4, 5], [9] * 20]
    params = [dataclasses.replace(SAMPLED, logprobs=None, prompt_logprobs=None, output_kind=DELTA, max_tokens=m)
              for m in (10, 14, 6)]
    plain = [_joined(outs) for outs in _run(llm, prompts, params).values()]
    with LLM(checkpoint_path(QWEN3), dtype="float32", max_model_len=256, kvcache_block_size=16,
             async_scheduling=True) as ahead:
        got = _run(ahead, prompts, params)
    for outs, ref, sp in zip(got.values(), plain, params):
        assert len(outs) == sp.max_tokens and all(len(o.token_ids) == 1 for o in outs)
        _same(_joined(outs), ref)
