"""The request-level adapter call (nanovllm_ref/oracle/requests.py) on nanovllm_ref."""

from __future__ import annotations

import pytest

from golden.load import checkpoint_path
from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting, supports_requests


@pytest.fixture(scope="module")
def adapter():
    a = NanovllmRefAdapter(checkpoint_path("qwen3-tiny"), "float32")
    yield a
    a.close()


def test_stop_token_and_per_request_logprobs(adapter) -> None:
    assert supports_requests(adapter)
    greedy = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
    full, = adapter.run_requests([RequestSpec([5, 6, 7], {**greedy, "logprobs": 3})])[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 8
    assert all(len(d) >= 3 and tok in d for d, tok in zip(full.logprobs, full.token_ids))
    stop_at = full.token_ids.index(full.token_ids[3])  # the first occurrence of that token
    (stopped,), (plain,) = adapter.run_requests([
        RequestSpec([5, 6, 7], {**greedy, "stop_token_ids": [full.token_ids[3]], "logprobs": 1}),
        RequestSpec([5, 6, 7], greedy),
    ])
    assert stopped.finish_reason == "stop" and stopped.token_ids == full.token_ids[: stop_at + 1]
    assert len(stopped.logprobs) == stop_at + 1 and plain.logprobs is None
    assert plain.token_ids == full.token_ids


def test_unknown_setting_is_refused_by_name(adapter) -> None:
    with pytest.raises(UnsupportedSetting, match="no_such_setting"):
        adapter.run_requests([RequestSpec([1, 2], {"no_such_setting": 1})])
