"""Incremental detokenization and stop strings (pure Python over a transformers tokenizer).

Text grows token by token by decoding a short window (vLLM's `detokenize_incrementally` idea): the text of
tokens[prefix:read] is known; the new text is what decoding tokens[prefix:] adds to it, kept back while it ends
in U+FFFD (a multi-byte character whose bytes are not all there yet), so no character is ever split. Stop
strings are searched in the text that the new piece may complete (a stop string may span tokens); the text is
cut before the stop string (after it with include_stop_str_in_output). `stream()` hands out text that can no
longer be cut, holding back the last len(longest stop) - 1 characters until the request finishes, so the
streamed pieces always concatenate to the final text. The engine keeps one per sequence with stop strings; the
server keeps one per streamed choice (`for_request`: the same text as the engine's), fed without the stop check
(the engine ends the request at its stop string). Reference: vLLM vllm/transformers_utils/detokenizer_utils.py.
"""

from __future__ import annotations

from typing import Any

from ..sampling_params import SamplingParams

_CONTEXT = 5  # prompt tokens decoded before the output, for tokenizers whose decoding depends on the left


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: list[int], stop: tuple[str, ...] = (),
                 include_stop_str_in_output: bool = False, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.stop, self.include_stop = tokenizer, stop, include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        self.tokens = list(prompt_ids[-_CONTEXT:])
        self.prefix_offset, self.read_offset = 0, len(self.tokens)
        self.num_fed = 0  # output tokens fed
        self.text = ""
        self.hold = max(map(len, stop), default=1) - 1
        self.streamed = 0
        self.stopped = False

    @classmethod
    def for_request(cls, tokenizer: Any, prompt_ids: list[int], params: SamplingParams) -> IncrementalDetokenizer:
        """The detokenizer whose text is the engine's output text for `params`: with stop strings decoded with the
        prompt's last tokens as context (as vLLM); without, from the output alone (as the engine's whole decode)."""
        return cls(tokenizer, prompt_ids if params.stop else [], params.stop, params.include_stop_str_in_output,
                   params.skip_special_tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if self.tokenizer else ""

    def add(self, token_ids: list[int], check_stop: bool = True) -> str | None:
        """Feed output tokens; returns the stop string that ended the text (nothing is added after it), or None."""
        for token in token_ids:
            if self.stopped:
                return None
            self.num_fed += 1
            self.tokens.append(token)
            known = self._decode(self.tokens[self.prefix_offset : self.read_offset])
            full = self._decode(self.tokens[self.prefix_offset :])
            if len(full) <= len(known) or full.endswith("\ufffd"):
                continue  # nothing new, or a character still incomplete: wait for the next token
            search_from = max(0, len(self.text) - self.hold)
            self.text += full[len(known) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
            found = self._find_stop(search_from) if check_stop else None
            if found is not None:
                return found
        return None

    def _find_stop(self, start: int) -> str | None:
        hits = [(at, s) for s in self.stop if (at := self.text.find(s, start)) >= 0]
        if not hits:
            return None
        at, s = min(hits)  # the earliest stop string in the text wins
        self.text = self.text[: at + (len(s) if self.include_stop else 0)]
        self.stopped = True
        return s

    def finish(self) -> str:
        """The final text: what a trailing incomplete character decodes to is added (unless a stop string cut it)."""
        if not self.stopped and self.read_offset < len(self.tokens):
            known = self._decode(self.tokens[self.prefix_offset : self.read_offset])
            self.text += self._decode(self.tokens[self.prefix_offset :])[len(known) :]
            self.read_offset = len(self.tokens)
        self.stopped = True
        return self.text

    def stream(self) -> str:
        """The next piece of text that is final (all of it once finished or stopped)."""
        end = len(self.text) if self.stopped else max(self.streamed, len(self.text) - self.hold)
        piece, self.streamed = self.text[self.streamed : end], end
        return piece
