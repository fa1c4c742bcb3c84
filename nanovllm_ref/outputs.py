"""What the engine returns: `RequestOutput`s, each holding `CompletionOutput`s (vLLM's shapes).

`LLM.generate` returns one final `RequestOutput` per request, in input order; `outputs` holds its n samples. From
`LLMEngine.step()` comes one `RequestOutput` for every request that advanced in the step (new tokens, new text, or
finished), shaped by its `SamplingParams.output_kind` (vLLM's `RequestOutputKind`): CUMULATIVE (everything so far),
DELTA (only what is new; `add(..., aggregate=True)` joins them back), FINAL_ONLY (once, finished). For n > 1 a
step's output carries the samples that advanced in it, each with its `index` (vLLM's streaming of n); the final
output of a FINAL_ONLY request carries all n. The request's own fields (token_ids, text, ...) repeat its first
carried sample, `outputs[0]` (the whole story when n = 1). References: vLLM vllm/outputs.py,
vllm/v1/engine/output_processor.py, vllm/v1/engine/parallel_sampling.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it (None for EOS/length)
    logprobs: list[dict[int, float]] | None = None
    error: str | None = None
    # speculative decoding, so far (cumulative in every output kind): draft tokens verified, and accepted
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    logprobs: list[dict[int, float]] | None = None  # one dict per generated token: top-k + chosen
    prompt_logprobs: list[dict[int, float] | None] | None = None  # None for the first prompt token
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    error: str | None = None  # why the request ended with finish_reason "error"
    stop_reason: int | str | None = None
    outputs: list[CompletionOutput] = field(default_factory=list)  # the samples carried, by index
    finished: bool | None = None  # every sample finished (None: taken from finish_reason)

    def __post_init__(self) -> None:
        if self.finished is None:
            self.finished = self.finish_reason is not None

    def add(self, next_output: RequestOutput, aggregate: bool = True) -> None:
        """Merge a later output of the same request into this one (vLLM's `RequestOutput.add`): `aggregate` joins
        DELTA outputs (text, token ids and logprobs appended), otherwise a sample's newer output replaces its older
        one (CUMULATIVE). The request's own fields then repeat sample `outputs[0]`."""
        mine = {c.index: c for c in self.outputs}
        for new in next_output.outputs:
            old = mine.get(new.index)
            if old is None or not aggregate:  # (a copy: the lists it extends later are its own)
                mine[new.index] = dataclasses.replace(
                    new, token_ids=list(new.token_ids), logprobs=None if new.logprobs is None else list(new.logprobs))
                continue
            old.text += new.text
            old.token_ids.extend(new.token_ids)
            if new.logprobs is not None:
                old.logprobs = [] if old.logprobs is None else old.logprobs
                old.logprobs.extend(new.logprobs)
            old.finish_reason, old.stop_reason, old.error = new.finish_reason, new.stop_reason, new.error
            old.num_draft_tokens, old.num_accepted_tokens = new.num_draft_tokens, new.num_accepted_tokens
        self.outputs = [mine[i] for i in sorted(mine)]
        if self.prompt_logprobs is None:
            self.prompt_logprobs = next_output.prompt_logprobs
        self.num_cached_tokens, self.finished = next_output.num_cached_tokens, self.finished or next_output.finished
        self.error = next((c.error for c in self.outputs if c.error is not None), next_output.error)
        first = self.outputs[0] if self.outputs else None
        if first is not None:
            self.token_ids, self.text, self.logprobs = first.token_ids, first.text, first.logprobs
            self.finish_reason, self.stop_reason = first.finish_reason, first.stop_reason
