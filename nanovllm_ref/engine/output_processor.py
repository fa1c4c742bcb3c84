"""What `LLMEngine.step()` returns: a `RequestOutput` per request that advanced, shaped by its output kind.

vLLM's `RequestOutputKind` (vllm/v1/engine/output_processor.py): CUMULATIVE outputs carry everything so far,
DELTA outputs only what is new since the request's previous output, FINAL_ONLY requests give one output, when they
finish. A sample "advanced" in a step when it has tokens or text it had not reported, or finished; for n > 1 an
output carries the samples that advanced (vLLM streams each sample on its own; the final output of a FINAL_ONLY
request carries all n). Text comes from the one detokenization path (detokenizer.py): what `stream()` hands out,
text that can no longer change (a possible stop string is held back while the sample runs), so the text of a
CUMULATIVE output is the concatenation of the DELTA ones, and both end on the final text. Prompt logprobs come
with a DELTA request's first output, and with every output of the other kinds (as vLLM).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import RequestOutputKind
from .detokenizer import feed
from .sequence import Sequence

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY


class _Reported:
    """What a request's outputs have carried so far."""

    __slots__ = ("prompt_ids", "tokens", "done", "prompt_logprobs")

    def __init__(self, lead: Sequence, n: int) -> None:
        self.prompt_ids = lead.token_ids[: lead.num_prompt_tokens]
        self.tokens = [0] * n  # per sample: output tokens reported
        self.done = [False] * n  # per sample: reported finished
        self.prompt_logprobs = False  # reported (DELTA)


class OutputProcessor:
    """Builds the outputs of the requests the engine holds. `finalize(seq)` settles a finished sample's text and
    stop reason before it is read (the engine's rule for stop tokens)."""

    def __init__(self, finalize: Callable[[Sequence], None]) -> None:
        self.finalize = finalize
        self._reported: dict[str, _Reported] = {}
        self.num_streaming = 0  # requests (not FINAL_ONLY) that give outputs while they run

    def add(self, group: list[Sequence]) -> None:
        lead = group[0]
        self._reported[lead.request_id] = _Reported(lead, len(group))
        self.num_streaming += lead.params.output_kind is not FINAL_ONLY

    def progress(self, groups: Iterable[list[Sequence]]) -> list[RequestOutput]:
        """The outputs of running (not yet finished) requests that advanced; FINAL_ONLY ones give none."""
        outs = []
        for group in groups:
            if group[0].params.output_kind is not FINAL_ONLY:
                out = self._output(group, finished=False)
                if out is not None:
                    outs.append(out)
        return outs

    def final(self, group: list[Sequence]) -> RequestOutput:
        """The output of a request all of whose samples finished; it is forgotten afterwards."""
        out = self._output(group, finished=True)
        self.num_streaming -= group[0].params.output_kind is not FINAL_ONLY
        del self._reported[group[0].request_id]
        return out

    def _output(self, group: list[Sequence], finished: bool) -> RequestOutput | None:
        lead, kind = group[0], group[0].params.output_kind
        reported = self._reported[lead.request_id]
        samples = [c for i, s in enumerate(group) if (c := self._sample(s, i, reported, kind)) is not None]
        if not samples:
            return None
        prompt_logprobs = lead.prompt_logprobs
        if kind is DELTA:
            prompt_logprobs, reported.prompt_logprobs = (None if reported.prompt_logprobs else prompt_logprobs), True
        first = samples[0]
        error = next((s.error for s in group if s.error is not None), None) if finished else first.error
        return RequestOutput(
            request_id=lead.request_id, prompt_token_ids=reported.prompt_ids, token_ids=first.token_ids,
            text=first.text, finish_reason=first.finish_reason, logprobs=first.logprobs,
            prompt_logprobs=prompt_logprobs, num_cached_tokens=lead.num_cached_tokens, error=error,
            stop_reason=first.stop_reason, outputs=samples, finished=finished,
        )

    def _sample(self, s: Sequence, i: int, reported: _Reported, kind: RequestOutputKind) -> CompletionOutput | None:
        """Sample i's part of the output, None when it has nothing new (FINAL_ONLY: every sample, at the end)."""
        if reported.done[i]:
            return None
        if s.is_finished:
            self.finalize(s)
        else:
            feed(s)  # (its text is read now: a request without stop strings is fed when read)
        detok, num = s.detokenizer, s.num_output_tokens
        piece = "" if detok is None else detok.stream(s.is_finished)
        start = reported.tokens[i]
        if kind is not FINAL_ONLY and num == start and not piece and not s.is_finished:
            return None
        reported.tokens[i], reported.done[i] = num, s.is_finished
        if kind is not DELTA:
            start, piece = 0, "" if detok is None else detok.text[: detok.streamed]
        logprobs = None if s.logprobs is None else s.logprobs[start:num]
        return CompletionOutput(i, s.token_ids[s.num_prompt_tokens + start: s.num_prompt_tokens + num], piece,
                                s.finish_reason, s.stop_reason, logprobs, s.error, s.num_draft_tokens,
                                s.num_accepted_tokens)
