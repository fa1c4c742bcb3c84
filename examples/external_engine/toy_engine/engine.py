"""The engine: a transformers model's forward pass driven by its own greedy decode loop over a KV cache.

It knows nothing about nanovllm_ref: it has its own request/result types, as any engine does, and the adapter
(toy_engine/adapter.py) translates them for the conformance suite.

``TOY_ENGINE_BUG=argmin@R:S`` plants a bug for demonstrations and tests: the R-th request (0-based, counted
within one ``generate`` call) picks the least likely token instead of the most likely at generated step S.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ToyResult:
    """One request's result: tokens, the top logprobs of every step, and the prompt logprobs if asked."""

    token_ids: list[int] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] | None = None


def _parse_bug(spec: str) -> tuple[int, int] | None:
    if not spec:
        return None
    kind, _, where = spec.partition("@")
    request, _, step = where.partition(":")
    if kind != "argmin" or not request.isdigit() or not step.isdigit():
        raise ValueError(f"TOY_ENGINE_BUG={spec!r}: expected 'argmin@REQUEST:STEP'")
    return int(request), int(step)


def _top(logprobs: torch.Tensor, n: int) -> dict[int, float]:
    vals, ids = torch.topk(logprobs, n)
    return dict(zip(ids.tolist(), vals.tolist()))


class ToyEngine:
    """Greedy generation, one request at a time, with PyTorch SDPA attention (the goldens used eager)."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype],
                                                          attn_implementation="sdpa").to(device).eval()
        self.device = device
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._bug = _parse_bug(os.environ.get("TOY_ENGINE_BUG", ""))

    def generate(self, prompts: list[list[int]], max_new_tokens: int, num_logprobs: int,
                 prompt_logprobs: bool = False) -> list[ToyResult]:
        return [self._request(i, p, max_new_tokens, num_logprobs, prompt_logprobs) for i, p in enumerate(prompts)]

    @torch.inference_mode()
    def _request(self, index: int, prompt: list[int], max_new_tokens: int, n: int, want_prompt: bool) -> ToyResult:
        result = ToyResult()
        out = self.model(input_ids=torch.tensor([prompt], device=self.device), use_cache=True)
        logprobs = out.logits[0].float().log_softmax(-1)
        if want_prompt:
            result.prompt_logprobs = [None] + [
                {**_top(logprobs[i - 1], n), prompt[i]: float(logprobs[i - 1, prompt[i]])}
                for i in range(1, len(prompt))
            ]
        last = logprobs[-1]
        for step in range(max_new_tokens):
            token = int(last.argmax())
            if self._bug == (index, step):
                token = int(last.argmin())
            result.token_ids.append(token)
            result.top_logprobs.append({**_top(last, n), token: float(last[token])})
            if step + 1 == max_new_tokens:
                break
            cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
            out = self.model(input_ids=torch.tensor([[token]], device=self.device), use_cache=True,
                             **{self._cache_kw: cache})
            last = out.logits[0, -1].float().log_softmax(-1)
        return result
