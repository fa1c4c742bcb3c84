"""VLLMAdapter's text capabilities against a fake of vLLM's LLMEngine (DELTA outputs per step; no vLLM needed):
each completion's pieces, tokens, finish_reason and stop_reason."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

from nanovllm_ref.oracle.external_adapters import VLLMAdapter
from nanovllm_ref.oracle.requests import UNREPORTED, RequestSpec


class _Engine:
    """Two steps: each request's samples send one delta each, the second with the finish."""

    def __init__(self) -> None:
        self.requests: dict[str, tuple] = {}
        self.steps = 0

    def add_request(self, rid, prompt, params) -> None:
        assert params.kwargs["output_kind"] == "DELTA"
        self.requests[rid] = (prompt, params.kwargs.get("n", 1))

    def has_unfinished_requests(self) -> bool:
        return self.steps < 2

    def step(self) -> list:
        self.steps += 1
        last = self.steps == 2
        return [NS(request_id=rid, outputs=[
            NS(index=i, token_ids=[self.steps * 10 + i], text=f"p{self.steps}s{i}",
               finish_reason="stop" if last else None, stop_reason="p2" if last else None) for i in range(n)])
            for rid, (_, n) in self.requests.items()]


def test_vllm_stream_requests_collects_each_samples_pieces_and_reasons(monkeypatch) -> None:
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kwargs: NS(kwargs=kwargs)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = NS(DELTA="DELTA")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    adapter = VLLMAdapter.__new__(VLLMAdapter)
    adapter.llm = NS(llm_engine=_Engine())
    out = adapter.stream_requests([RequestSpec([1, 2], {"n": 2, "stop": ["x"]}), RequestSpec([3], {})])
    assert [len(o) for o in out] == [2, 1]
    s = out[0][1]
    assert s.pieces == ["p1s1", "p2s1"] and s.completion.text == "p1s1p2s1" and s.completion.token_ids == [11, 21]
    assert (s.completion.finish_reason, s.completion.stop_reason) == ("stop", "p2")
    assert out[1][0].completion.stop_reason is not UNREPORTED
