"""Hypothesis fuzzing of what users send: `SamplingParams` keyword arguments through `LLM.generate`, and
request bodies through the server. Every input is refused with a message or served, and a normal request
succeeds afterwards. Field names come from `dataclasses.fields(SamplingParams)` and the request models, so
parameters added later are fuzzed too."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.serve.protocol import ChatCompletionRequest, CompletionRequest

from ..conftest import QWEN3, checkpoint_path
from ..support.server import MODEL, running_server

httpx = pytest.importorskip("httpx")

GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
HUGE = 2**70
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.integers(-HUGE, HUGE),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))
WILD = st.one_of(SCALARS, st.lists(st.one_of(st.integers(-3, 2000), st.integers(-HUGE, HUGE), st.text(max_size=2)),
                                   max_size=3),
                 st.dictionaries(st.one_of(st.integers(-5, 2000), st.text(max_size=3)), SCALARS, max_size=2))
PLAUSIBLE = st.one_of(st.none(), st.booleans(), st.integers(0, 4), st.floats(0, 2))
VALUES = st.one_of(PLAUSIBLE, PLAUSIBLE, PLAUSIBLE, WILD)  # most values near the valid range, some anywhere
MAX_TOKENS = st.one_of(st.integers(1, 4), st.integers(1, 4), WILD)
FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]


@pytest.fixture(scope="module")
def llm():
    with LLM(str(checkpoint_path(QWEN3)), dtype="float32", max_model_len=128) as llm:
        yield llm


@given(kwargs=st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=5),
       max_tokens=MAX_TOKENS)
def test_sampling_params_are_refused_with_a_message_or_served(llm, kwargs, max_tokens):
    kwargs = {**kwargs, "max_tokens": max_tokens}
    try:
        params = SamplingParams(**kwargs)
        outs = llm.generate([[5, 6, 7]], params, use_tqdm=False)
    except (ValueError, TypeError) as e:
        assert str(e), kwargs
    else:
        assert outs[0].finish_reason in ("length", "stop"), (kwargs, outs[0])
    assert not llm.has_unfinished()
    assert len(llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].token_ids) == 3


@pytest.fixture(scope="module")
def http():
    with running_server(max_model_len=128) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


NORMAL = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True}
COMPLETION_KEYS = sorted(CompletionRequest.model_fields) + ["bogus"]
CHAT_KEYS = sorted(ChatCompletionRequest.model_fields) + ["bogus"]
PROMPTS = st.one_of(st.just("def f("), st.lists(st.integers(0, 1600), max_size=4), WILD)
MESSAGES = st.one_of(st.just([{"role": "user", "content": "x"}]), st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "x"]), "content": WILD}), max_size=2), WILD)


def _check(r) -> None:
    if r.status_code != 200:
        assert r.status_code in (400, 404, 413), r.text
        assert r.json()["error"]["message"]
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]") or '"error"' in r.text, r.text[-500:]
    else:
        assert r.json()["choices"]


def _check_then_serve_normally(http, path: str, body: dict) -> None:
    """Whatever became of `body` (sent as raw JSON: hypothesis makes values pydantic would refuse to encode),
    the server still serves a normal request afterwards."""
    _check(http.post(path, content=json.dumps(body), headers={"content-type": "application/json"}))
    r = http.post("/v1/completions", json=NORMAL)
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3


@given(body=st.dictionaries(st.sampled_from(COMPLETION_KEYS), VALUES, max_size=3), prompt=PROMPTS,
       max_tokens=MAX_TOKENS)
def test_completion_bodies_are_refused_with_a_message_or_served(http, body, prompt, max_tokens):
    body = {"model": MODEL, **body, "prompt": prompt, "max_tokens": max_tokens}
    _check_then_serve_normally(http, "/v1/completions", body)


@given(body=st.dictionaries(st.sampled_from(CHAT_KEYS), VALUES, max_size=3), messages=MESSAGES,
       max_tokens=MAX_TOKENS)
def test_chat_bodies_are_refused_with_a_message_or_served(http, body, messages, max_tokens):
    body = {"model": MODEL, **body, "messages": messages, "max_tokens": max_tokens}
    _check_then_serve_normally(http, "/v1/chat/completions", body)
