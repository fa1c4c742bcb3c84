"""The OpenAI adapter splits a request's ``n`` over several requests within the server's cap, keeping sample i on
seed + i (nanovllm_ref/oracle/openai_adapter.py)."""

from __future__ import annotations

import threading
import types

import pytest

from nanovllm_ref.oracle.openai_adapter import MAX_N_PER_REQUEST, OpenAIAdapter, split_n
from nanovllm_ref.oracle.requests import RequestSpec


def test_split_n_parts_cover_every_sample_with_its_seed() -> None:
    assert split_n({"n": 64, "seed": 3}, 64) == [{"n": 64, "seed": 3}]
    assert split_n({"n": 130, "temperature": 1.0}, 64) == [{"n": 64, "temperature": 1.0}, {"n": 64, "temperature": 1.0},
                                                          {"n": 2, "temperature": 1.0}]
    near_top = 2**63 - 10
    parts = split_n({"n": 150, "seed": near_top}, 64)
    assert [p["n"] for p in parts] == [64, 64, 22]
    assert [p["seed"] % 2**64 for p in parts] == [near_top, near_top + 64, near_top + 128]  # seed + start, mod 2^64
    assert all(-(2**63) <= p["seed"] < 2**63 for p in parts)  # each within int64, as a server parses it


def fake_server(monkeypatch: pytest.MonkeyPatch, cap: int, **kwargs) -> tuple[OpenAIAdapter, list[dict]]:
    """An adapter on a fake server that refuses n > cap, as nanovllm_ref's does, and answers sample k of a request
    seeded s with token (s + k) % 1000."""
    monkeypatch.setattr(OpenAIAdapter, "_facts", lambda self: types.SimpleNamespace(names=["m"]))
    adapter, sent, lock = OpenAIAdapter("http://x/v1", **kwargs), [], threading.Lock()

    def post(payload: dict) -> dict:
        with lock:
            sent.append(payload)
        if payload["n"] > cap:
            raise RuntimeError(f"HTTP 400: n must be in [1, {cap}], got {payload['n']}")
        tok = lambda k: (payload["seed"] + k) % 1000  # noqa: E731
        return {"choices": [{"index": k, "finish_reason": "length",
                             "logprobs": {"tokens": [f"token_id:{tok(k)}"], "top_logprobs": [{}]}}
                            for k in reversed(range(payload["n"]))]}

    monkeypatch.setattr(adapter, "_post", post)
    return adapter, sent


def test_run_requests_splits_n_over_the_cap_and_keeps_sample_order(monkeypatch) -> None:
    adapter, sent = fake_server(monkeypatch, cap=MAX_N_PER_REQUEST)
    out = adapter.run_requests([RequestSpec([1, 2], {"n": 2000, "seed": 500, "temperature": 1.0})])
    assert len(sent) == 32 and max(p["n"] for p in sent) == MAX_N_PER_REQUEST
    assert [c.token_ids[0] for c in out[0]] == [(500 + i) % 1000 for i in range(2000)]  # sample i: seed + i


def test_the_cap_is_an_engine_arg(monkeypatch) -> None:
    adapter, sent = fake_server(monkeypatch, cap=8, max_n_per_request=8)
    assert len(adapter.run_requests([RequestSpec([1], {"n": 20, "seed": 0})])[0]) == 20 and len(sent) == 3
    adapter, _ = fake_server(monkeypatch, cap=8)  # the default cap (64) is above this server's
    with pytest.raises(RuntimeError, match="n must be in"):
        adapter.run_requests([RequestSpec([1], {"n": 20, "seed": 0})])
    with pytest.raises(ValueError, match="max_n_per_request must be an integer >= 1, got 0"):
        fake_server(monkeypatch, cap=8, max_n_per_request=0)
