"""Incremental detokenization for streams, with stop strings.

`TextStream` turns token ids, as they come, into text deltas that never split a multi-byte UTF-8 character
(a byte-level BPE token may hold part of one: its text is held back while the decode ends in U+FFFD) and never
show a stop string: text that could be the start of one is held back until it cannot be, and a stop string ends
the stream, trimmed like vLLM (the text up to the stop string, or through it with `include_stop_str_in_output`).
The decode of each new piece starts a few tokens back (vLLM's prefix/read offsets) so tokenizers that change a
token's text by its neighbours (SentencePiece's leading space) decode the same as the whole sequence.
"""

from __future__ import annotations

import os
from typing import Any


class TextStream:
    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = (), include_stop: bool = False,
                 skip_special_tokens: bool = True, detect: bool = True) -> None:
        self.tokenizer, self.stop, self.include_stop = tokenizer, stop, include_stop
        self.skip_special = skip_special_tokens
        self.detect = detect  # False: the engine applies the stop strings (`settle`); this only holds back
        self.ids: list[int] = []
        self._prefix = self._read = 0  # ids[_prefix:_read] was decoded last time; ids[_read:] is new
        self.text = ""  # all stable text so far (after a stop: trimmed)
        self._sent = 0  # characters of `text` already handed out
        self.stopped = False  # a stop string was found: nothing more is taken
        self.num_tokens_at_stop = 0  # tokens up to the one that completed the stop string

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special) if self.tokenizer else ""

    def add(self, token_ids: list[int]) -> str:
        """Take new tokens; return the text that is now safe to send."""
        for token in token_ids:
            if self.stopped:
                break
            self.ids.append(token)
            new = self._decode(self.ids[self._prefix:])
            if new.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for the next token
                continue
            self.text += new[len(self._decode(self.ids[self._prefix:self._read])):]
            self._prefix, self._read = self._read, len(self.ids)
            self._find_stop()
        return self._take(final=False)

    def finish(self) -> str:
        """The rest of the text (held-back characters included) when the request ends."""
        if not self.stopped and self._read < len(self.ids):  # an incomplete character at the very end
            self.text += self._decode(self.ids[self._prefix:])[len(self._decode(self.ids[self._prefix:self._read])):]
            self._read = len(self.ids)
            self._find_stop()
        return self._take(final=True)

    def settle(self, token_ids: list[int], text: str) -> str:
        """End with the engine's own text (it applied the stop strings, min_tokens included): the unsent rest."""
        if not text.startswith(self.text[: self._sent]):  # (only text that cannot begin a stop was sent)
            return self.add(token_ids) + self.finish()  # not expected: this stream's own decode, then
        self.ids += token_ids
        self.text, self.stopped = text, True
        return self._take(final=True)

    def _find_stop(self) -> None:
        if not self.detect:
            return
        start = max(0, self._sent - max((len(s) for s in self.stop), default=0))
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if hits:
            i, s = min(hits)
            self.text = self.text[: i + len(s) if self.include_stop else i]
            self.stopped, self.num_tokens_at_stop = True, len(self.ids)

    def _take(self, final: bool) -> str:
        end = len(self.text) if final or self.stopped else len(self.text) - self._held_back()
        out, self._sent = self.text[self._sent:end], max(self._sent, end)
        return out

    def _held_back(self) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        tail = self.text[self._sent:]
        for k in range(min(len(tail), max((len(s) - 1 for s in self.stop), default=0)), 0, -1):
            if any(s.startswith(tail[-k:]) for s in self.stop):
                return k
        return 0


def read_chat_template(value: str | None) -> str | None:
    """`--chat-template`: a file's contents, or the value itself when it is a Jinja template."""
    if value is None or "{{" in value or "{%" in value:
        return value
    if not os.path.isfile(value):
        raise ValueError(f"--chat-template: no such file {value!r} (and not a Jinja template)")
    with open(value) as f:
        return f.read()
