"""The user-facing entry point: `LLM(model, **config).generate(prompts, sampling_params)`."""

from __future__ import annotations

import time
from typing import Any

from tqdm.auto import tqdm

from .config import Config
from .engine.llm_engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **config: Any) -> None:
        self.config = Config.from_kwargs(model, **config)
        self.engine = LLMEngine(self.config)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; results come back in input order."""
        if not isinstance(prompts, (list, tuple)):
            raise TypeError("prompts must be a list of strings or a list of token-id lists")
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if not isinstance(sampling_params, (list, tuple)) or len(sampling_params) != len(prompts):
            got = len(sampling_params) if isinstance(sampling_params, (list, tuple)) else sampling_params
            raise ValueError(f"sampling_params must be one SamplingParams or a list of {len(prompts)}, got {got!r}")
        # all checked (and text tokenized, once) before any is added
        token_ids = [self.engine.validate_request(p, sp) for p, sp in zip(prompts, sampling_params)]
        ids = [self.engine.add_validated(t, sp) for t, sp in zip(token_ids, sampling_params)]
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Generating", dynamic_ncols=True, disable=not use_tqdm)
        start, num_out = time.perf_counter(), 0
        while self.engine.has_unfinished():
            for out in self.engine.step():
                results[out.request_id] = out
                num_out += len(out.token_ids)
                bar.update(1)
                bar.set_postfix(out_tok_s=f"{num_out / (time.perf_counter() - start):.0f}")
        bar.close()
        return [results[i] for i in ids]

    # step-level API
    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None) -> str:
        return self.engine.add_request(prompt, params, request_id)

    def step(self) -> list[RequestOutput]:
        return self.engine.step()

    def abort_request(self, request_id: str) -> RequestOutput | None:
        return self.engine.abort_request(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def reset_prefix_cache(self) -> None:
        self.engine.block_manager.reset_prefix_cache()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
