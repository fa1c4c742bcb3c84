"""Tensor parallelism on the CPU (gloo): TP=2 and TP=4 give TP=1's greedy tokens (and TP=2 on the Qwen3-MoE golden,
experts split along their intermediate dim); two TP engines coexist;
a killed worker surfaces as an error naming the rank within 30 s and leaves no process behind."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from nanovllm_ref import LLM, SamplingParams

from ..conftest import checkpoint_path

MODEL = "qwen3-gqa4"  # 8 query heads, 2 KV heads: TP=4 replicates each KV head on two ranks
PROMPTS = [[5, 6, 7], [9] * 20 + [3, 4], list(range(3, 60)), [11]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def reference():
    llm = LLM(str(checkpoint_path(MODEL)), dtype="float32", max_model_len=256)
    return llm.generate(PROMPTS, GREEDY, use_tqdm=False)


def _assert_same(outs, reference) -> None:
    for out, ref in zip(outs, reference):
        assert out.token_ids == ref.token_ids
        for a, b in zip(out.logprobs, ref.logprobs):
            assert max(abs(a[t] - b[t]) for t in b) < 1e-4


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_matches_tp1(reference, tp):
    with LLM(str(checkpoint_path(MODEL)), dtype="float32", max_model_len=256, tensor_parallel_size=tp) as llm:
        _assert_same(llm.generate(PROMPTS, GREEDY, use_tqdm=False), reference)
    assert not multiprocessing.active_children()


def test_moe_tp2_matches_tp1():
    path = str(checkpoint_path("qwen3-moe-tiny"))
    reference = LLM(path, dtype="float32", max_model_len=256).generate(PROMPTS, GREEDY, use_tqdm=False)
    with LLM(path, dtype="float32", max_model_len=256, tensor_parallel_size=2) as llm:
        _assert_same(llm.generate(PROMPTS, GREEDY, use_tqdm=False), reference)
    assert not multiprocessing.active_children()


def test_two_tp_engines_coexist(reference):
    path = str(checkpoint_path(MODEL))
    with LLM(path, dtype="float32", max_model_len=256, tensor_parallel_size=2) as a:
        with LLM(path, dtype="float32", max_model_len=256, tensor_parallel_size=2) as b:
            for p in PROMPTS:  # interleave the two engines' steps
                a.add_request(p, GREEDY)
                b.add_request(p, GREEDY)
            done_a, done_b = [], []
            while a.has_unfinished() or b.has_unfinished():
                done_a += [o for o in a.step() if o.finished] if a.has_unfinished() else []
                done_b += [o for o in b.step() if o.finished] if b.has_unfinished() else []
    for done in (done_a, done_b):
        _assert_same(sorted(done, key=lambda o: int(o.request_id)), reference)
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("victim", [0, 1])
def test_killed_worker_is_reported_within_30s_and_nothing_is_left(victim):
    llm = LLM(str(checkpoint_path(MODEL)), dtype="float32", max_model_len=256, tensor_parallel_size=2)
    for p in PROMPTS:
        llm.add_request(p, SamplingParams(max_tokens=50, ignore_eos=True))
    llm.step()
    worker = llm.engine.runner.procs[victim]
    worker.kill()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"rank {victim}"):
        while llm.has_unfinished():
            llm.step()
    assert time.monotonic() - start < 30
    llm.shutdown()
    assert not worker.is_alive() and not multiprocessing.active_children()


class _Alive:
    """A worker process that stays alive: its sentinel (the read end of a pipe nobody writes to) never fires."""

    exitcode = None

    def __init__(self) -> None:
        self.sentinel, self._keep = multiprocessing.Pipe(duplex=False)


def test_a_peer_reply_seen_early_is_kept_for_its_turn():
    """Rank 1 answers before rank 0: waiting for rank 0 must not drop rank 1's reply (it used to be read and
    thrown away, and the engine then waited for rank 1 until the startup timeout: an intermittent CI hang); while
    rank 0's reply is awaited, another rank's error fails at once, naming it."""
    import threading

    from nanovllm_ref.engine.workers import TPExecutor

    executor = TPExecutor.__new__(TPExecutor)  # no processes: pipes stand in for the workers
    pipes = [multiprocessing.Pipe() for _ in range(2)]
    executor.conns, executor.procs, executor._closed = [p for p, _ in pipes], [_Alive(), _Alive()], True
    pipes[1][1].send(("ready", 11))
    threading.Timer(0.5, pipes[0][1].send, args=(("ready", 10),)).start()
    assert executor._receive(range(2), 10) == [10, 11]
    pipes[1][1].send(("error", "boom"))
    threading.Timer(0.5, pipes[0][1].send, args=(("output", 0),)).start()
    with pytest.raises(RuntimeError, match="rank 1 failed: boom"):
        executor._receive(range(1), 10)


def test_tp2_async_scheduling_matches_tp1():
    """Steps without logprobs go through async scheduling under TP too (launch on every rank, rank 0 broadcasts
    its tokens as the next input ids on the device): greedy and seeded sampling (n = 2 too) give TP=1's tokens, also
    when rows finish at different steps, and with prompts chunked over several steps next to other rows' decodes
    (the step behind takes those rows' tokens on the device)."""
    prompts = PROMPTS + [[7] * 5, list(range(20, 41))]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 9, 6, 12, 1, 7)]
    params[1] = SamplingParams(temperature=0.8, seed=5, max_tokens=9, ignore_eos=True)
    params[3] = SamplingParams(temperature=0.8, seed=6, max_tokens=12, ignore_eos=True, n=2)
    path = str(checkpoint_path(MODEL))
    kw = dict(dtype="float32", max_model_len=256, max_num_batched_tokens=16)
    with LLM(path, **kw) as llm:
        want = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]
    with LLM(path, tensor_parallel_size=2, async_scheduling=True, **kw) as llm:  # (on the CPU: asked for)
        launches = []
        original = llm.engine.runner.launch
        llm.engine.runner.launch = lambda step, prev=None, rows=None, **kw: launches.append(
            (rows is not None, rows is not None and step.max_query_len > 1)) or original(step, prev, rows, **kw)
        got = [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want
    assert sum(p for p, _ in launches) > 5, "steps did not take the async path under TP"
    assert sum(c for _, c in launches) >= 2, "no step with prefill chunks took input ids on the device under TP"
    assert not multiprocessing.active_children()
