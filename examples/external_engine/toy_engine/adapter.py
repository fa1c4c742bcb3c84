"""The conformance adapter of toy_engine: ``--engine toy_engine.adapter:make_engine``.

nanovllm_ref's suite calls ``make_engine(model_path, dtype)`` once per checkpoint and dtype, then
``generate(prompts, max_tokens, top_k, prompt_logprobs)`` (greedy, EOS ignored, token-id prompts), and
compares the returned ``EngineOutput``s with transformers' goldens.
"""

from __future__ import annotations

from nanovllm_ref.oracle import EngineAdapter, EngineOutput

from .engine import ToyEngine


class ToyEngineAdapter:
    name = "toy_engine"

    def __init__(self, model_path: str, dtype: str) -> None:
        self.engine = ToyEngine(model_path, dtype)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        results = self.engine.generate(prompts, max_tokens, top_k, prompt_logprobs)
        return [EngineOutput(r.token_ids, r.top_logprobs, r.prompt_logprobs) for r in results]

    def close(self) -> None:
        self.engine = None


def make_engine(model_path: str, dtype: str, **kwargs: object) -> EngineAdapter:
    if kwargs:
        raise TypeError(f"toy_engine takes no engine settings, got {sorted(kwargs)}")
    return ToyEngineAdapter(model_path, dtype)
