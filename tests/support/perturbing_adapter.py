"""A deliberately wrong engine for tests: nanovllm_ref with one generated token or one logprob changed.

Used as `--engine tests.support.perturbing_adapter:token_factory` (or `:logprob_factory`) to show that the
conformance suite fails and names the prompt and position."""

from __future__ import annotations

from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.compare import EngineOutput

PROMPT, STEP = 3, 5  # which prompt and generated step get perturbed


class Perturbing(NanovllmRefAdapter):
    name = "perturbed"

    def __init__(self, model_path: str, dtype: str, what: str, **kwargs) -> None:
        super().__init__(model_path, dtype, **kwargs)
        self.what = what

    def generate(self, prompts, max_tokens, top_k, prompt_logprobs) -> list[EngineOutput]:
        outs = super().generate(prompts, max_tokens, top_k, prompt_logprobs)
        out = outs[PROMPT]
        if self.what == "token":
            # a token outside the top-k: no tolerance policy may accept it
            out.token_ids[STEP] = next(t for t in range(3, 10**6) if t not in out.topk[STEP])
        else:
            token = out.token_ids[STEP]
            out.topk[STEP] = {**out.topk[STEP], token: out.topk[STEP][token] - 0.05}
        return outs


def token_factory(model_path: str, dtype: str, **kwargs) -> Perturbing:
    return Perturbing(model_path, dtype, "token", **kwargs)


def logprob_factory(model_path: str, dtype: str, **kwargs) -> Perturbing:
    return Perturbing(model_path, dtype, "logprob", **kwargs)
