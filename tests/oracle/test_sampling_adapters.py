"""run_requests of the vllm and openai adapters, against fakes of the shapes they read (no engine needed)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

import pytest

from nanovllm_ref.oracle.external_adapters import VLLMAdapter
from nanovllm_ref.oracle.openai_adapter import OpenAIAdapter
from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting


@pytest.fixture
def fake_vllm(monkeypatch):
    class SamplingParams:
        NAMES = {"n", "temperature", "top_k", "max_tokens", "seed", "logprobs", "repetition_penalty", "stop"}

        def __init__(self, **kwargs):
            unknown = set(kwargs) - self.NAMES
            if unknown:
                raise TypeError(f"unexpected keyword argument {sorted(unknown)}")
            self.kwargs = kwargs

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)

    class LLM:
        llm_engine = NS(model_config=NS(logprobs_mode=NS(value="raw_logprobs")))

        def generate(self, prompts, params, use_tqdm):
            self.seen = params
            return [NS(prompt_logprobs=None, num_cached_tokens=0, outputs=[
                NS(token_ids=[i, 7], finish_reason="length", text=f"t{i}",
                   logprobs=[{i: NS(logprob=-0.5)}, {7: NS(logprob=-1.0)}]) for i in range(p.kwargs.get("n", 1))])
                for p in params]

    adapter = VLLMAdapter.__new__(VLLMAdapter)
    adapter.llm = LLM()
    return adapter


def test_vllm_run_requests_passes_names_and_returns_n_completions(fake_vllm) -> None:
    out = fake_vllm.run_requests([RequestSpec([1, 2], {"n": 3, "temperature": 0.5, "logprobs": 1}),
                                  RequestSpec([3], {"max_tokens": 2, "logprobs_mode": "raw_logprobs"})])
    assert fake_vllm.llm.seen[0].kwargs == {"n": 3, "temperature": 0.5, "logprobs": 1}
    assert [len(o) for o in out] == [3, 1]
    assert out[0][2].token_ids == [2, 7] and out[0][2].text == "t2" and out[0][2].logprobs == [{2: -0.5}, {7: -1.0}]


def test_vllm_run_requests_unsupported_settings(fake_vllm) -> None:
    with pytest.raises(UnsupportedSetting, match="logprobs_mode"):
        fake_vllm.run_requests([RequestSpec([1], {"logprobs_mode": "processed_logprobs"})])
    with pytest.raises(UnsupportedSetting, match="min_p"):
        fake_vllm.run_requests([RequestSpec([1], {"min_p": 0.1})])


def test_openai_run_requests_payload_and_choices(monkeypatch) -> None:
    facts = types.SimpleNamespace(names=["m"])
    monkeypatch.setattr(OpenAIAdapter, "_facts", lambda self: facts)  # no server: the adapter asks what is served
    adapter = OpenAIAdapter("http://x/v1")
    sent = []

    def post(payload):
        sent.append(payload)
        choice = lambda i: {"index": i, "text": f"t{i}", "finish_reason": "stop",  # noqa: E731
                            "logprobs": {"tokens": [f"token_id:{i}", "token_id:9"],
                                         "top_logprobs": [{f"token_id:{i}": -0.1}, {"token_id:9": -0.2}]}}
        return {"choices": [choice(i) for i in reversed(range(payload.get("n", 1)))]}

    monkeypatch.setattr(adapter, "_post", post)
    out = adapter.run_requests([RequestSpec([5, 6], {"n": 2, "logit_bias": {3: 1.5}, "min_p": 0.1}),
                                RequestSpec([5], {"logprobs": 1})])
    assert sent[0]["logit_bias"] == {"3": 1.5} and sent[0]["min_p"] == 0.1 and sent[0]["logprobs"] == 0
    assert sent[0]["prompt"] == [5, 6] and sent[0]["return_tokens_as_token_ids"] is True
    assert [c.token_ids for c in out[0]] == [[0, 9], [1, 9]] and out[0][0].logprobs is None
    assert out[1][0].logprobs == [{0: -0.1}, {9: -0.2}] and out[1][0].finish_reason == "stop"
    with pytest.raises(UnsupportedSetting, match="logprobs_mode"):
        adapter.run_requests([RequestSpec([5], {"logprobs_mode": "processed_logits"})])
