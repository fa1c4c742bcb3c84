"""oracle/schedule_check.py: each invariant flags a hand-made decision that breaks it and passes a sound one;
nanovllm_ref's scheduler, observed through the adapter's hook, makes only sound decisions under pressure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nanovllm_ref.oracle.schedule_check import ScheduleDecision, ScheduledRequest, check_decision

BS = 4


def req(rid: str, new: int, computed: int, tokens: int, table: tuple[int, ...], prefix: tuple[int, ...] = ()):
    toks = prefix + tuple(range(100, 100 + tokens - len(prefix)))
    return ScheduledRequest(rid, new, computed, toks, table)


def decision(scheduled, running=None, waiting=(), arrival=(), budget=8, **kw) -> ScheduleDecision:
    return ScheduleDecision(0, budget, 4, BS, tuple(scheduled), tuple(waiting), tuple(arrival),
                            tuple(running if running is not None else scheduled), **kw)


def sound() -> ScheduleDecision:
    a = req("a", 1, 8, 9, (0, 1, 2))  # a decode
    b = req("b", 7, 0, 10, (3, 4))  # a prefill chunk cut by the budget (1 + 7 = 8)
    return decision([a, b], waiting=("b", "c"), arrival=(1, 2))


def test_a_sound_decision_passes() -> None:
    assert check_decision(sound()) == []


@pytest.mark.parametrize("breakage,expected", [
    (lambda d: replace(d, max_num_batched_tokens=7), "max_num_batched_tokens"),
    (lambda d: replace(d, max_num_seqs=1), "max_num_seqs"),
    (lambda d: replace(d, scheduled=(replace(d.scheduled[0], num_new_tokens=0),) + d.scheduled[1:]), "granted 0"),
    (lambda d: replace(d, scheduled=(replace(d.scheduled[0], num_new_tokens=2),) + d.scheduled[1:]), "known tokens"),
    (lambda d: replace(d, scheduled=d.scheduled[:1] + (replace(d.scheduled[1], block_table=(3,)),)), "blocks of"),
    (lambda d: replace(d, max_num_batched_tokens=9), "was not used up"),
    (lambda d: replace(d, waiting_before=("c", "b"), waiting_arrival=(2, 1)), "head"),
    (lambda d: replace(d, waiting_before=("b", "c", "d"), waiting_arrival=(1, 3, 2)), "arrival order"),
    (lambda d: replace(d, running=d.running[:1] + (replace(d.running[1], block_table=(2, 4)),)), "without a shared"),
    (lambda d: replace(d, running=d.running[:1] + (replace(d.running[1], block_table=(3, 3)),)), "twice"),
    (lambda d: replace(d, preempted=("z",), preempted_tables=((5,),)), "still holds"),
    (lambda d: replace(d, block_contents={0: (1, 2, 3, 4)}), "other tokens"),
    (lambda d: replace(d, ref_counts={3: 2}), "reference count"),
    (lambda d: replace(d, ref_counts={11: 1}), "leaked"),
])
def test_each_invariant_catches_its_breakage(breakage, expected) -> None:
    errors = check_decision(breakage(sound()))
    assert any(expected in e for e in errors), errors


def test_a_prefix_cache_share_is_allowed() -> None:
    shared = tuple(range(8))
    a = req("a", 1, 9, 10, (7, 8, 9), prefix=shared)
    b = req("b", 2, 8, 10, (7, 8, 9 + 1), prefix=shared)  # blocks 7 and 8 shared: same tokens, full, computed
    d = decision([a, b], budget=3, block_contents={7: shared[:4], 8: shared[4:]})
    assert check_decision(d) == []
    c = replace(b, num_computed_tokens=4)  # block 8 not yet computed by b: not a share
    assert any("without a shared" in e for e in check_decision(replace(d, running=(a, c), scheduled=(a, c))))


def test_nanovllm_ref_decisions_are_sound_under_pressure() -> None:
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
    from nanovllm_ref.oracle.requests import RequestSpec

    adapter = NanovllmRefAdapter(checkpoint_path("qwen3-tiny"), "float32", num_kvcache_blocks=10,
                                 max_model_len=120, max_num_batched_tokens=17)
    errors, steps = [], []
    adapter.observe_schedule(lambda d: (steps.append(d), errors.extend(check_decision(d))))
    try:
        prompts = [[(7 * i + j) % 500 + 1 for j in range(30 + 11 * i)] for i in range(6)]
        prompts.append(prompts[0][:20] + [3, 4, 5])  # a prefix share
        adapter.run_requests([RequestSpec(p, {"temperature": 0.0, "max_tokens": 20, "ignore_eos": True})
                              for p in prompts])
        assert adapter.num_preemptions > 0 and len(steps) > 20
        assert errors == []
    finally:
        adapter.close()
