"""The cached-tokens capability of the adapters: prefix_cache_kwargs, and the OpenAI adapter's usage field."""

from __future__ import annotations

import types

from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.external_adapters import VLLMAdapter
from nanovllm_ref.oracle.openai_adapter import OpenAIAdapter
from nanovllm_ref.oracle.requests import RequestSpec


def test_prefix_cache_kwargs_size_the_cache_in_each_engines_terms() -> None:
    assert NanovllmRefAdapter.prefix_cache_kwargs(16, 11, 176) == {
        "kvcache_block_size": 16, "num_kvcache_blocks": 11, "max_model_len": 176, "enable_prefix_caching": True}
    # vLLM keeps one block aside (its null block): 12 blocks give 11 usable
    assert VLLMAdapter.prefix_cache_kwargs(16, 11, 176) == {
        "block_size": 16, "num_gpu_blocks_override": 12, "max_model_len": 176, "enable_prefix_caching": True}


def test_openai_run_requests_reports_cached_tokens_from_usage(monkeypatch) -> None:
    monkeypatch.setattr(OpenAIAdapter, "_facts", lambda self: types.SimpleNamespace(names=["m"]))
    adapter = OpenAIAdapter("http://x/v1")
    usage = {"prompt_tokens": 40, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 32}}

    def post(payload):
        choice = {"index": 0, "text": "t", "finish_reason": "length",
                  "logprobs": {"tokens": ["token_id:7"], "top_logprobs": [{"token_id:7": -0.1}]}}
        return {"choices": [choice], "usage": usage if payload["prompt"][0] == 1 else {"prompt_tokens": 1}}

    monkeypatch.setattr(adapter, "_post", post)
    out = adapter.run_requests([RequestSpec([1, 2], {"max_tokens": 1}), RequestSpec([2], {"max_tokens": 1})])
    assert out[0][0].num_cached_tokens == 32
    assert out[1][0].num_cached_tokens is None  # not reported: unknown, not 0
