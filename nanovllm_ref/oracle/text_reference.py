"""What a request's text, finish_reason and stop_reason must be, given its prompt and a token trajectory.

The policy is vLLM's (written down in nanovllm_ref/engine/detokenizer.py; vLLM vllm/v1/engine/detokenizer.py,
vllm/v1/core/sched/utils.py ``check_stop``), computed here on its own with the reference tokenizer
(transformers' ``AutoTokenizer`` of the checkpoint, its ``decode`` without ``clean_up_tokenization_spaces``):

* each output token adds ``decode(window + [token])[len(decode(window)):]`` to the text, the window starting at
  the prompt's shortest suffix of 4..23 tokens decoding without U+FFFD (else the whole prompt); nothing while
  that decoding ends in U+FFFD (an incomplete character: a piece never ends inside one, and a character never
  completed is not in the text); a decoding that no longer starts with the window's given text restarts from the
  token alone; with special tokens kept and ``spaces_between_special_tokens`` false, an added token right after
  another one adds its bare content;
* at each step, in vLLM's order: the token ends the request if it is a stop token (EOS unless ``ignore_eos``,
  ``stop_token_ids``; its text then left out unless ``include_stop_str_in_output``) or the last allowed one
  (``length``); then stop strings are searched once more than ``min_tokens`` tokens were generated, in the new
  text and the len(stop) - 1 characters before it; the earliest wins, the text is cut before it (after it with
  ``include_stop_str_in_output``), finish_reason "stop", stop_reason the string. A stop token's stop_reason is
  its id, None for the tokenizer's EOS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def checkpoint_eos(path: str) -> set[int]:
    """The EOS ids of a checkpoint: config.json's and generation_config.json's ``eos_token_id``."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        f = Path(path) / name
        if f.is_file():
            e = json.loads(f.read_text()).get("eos_token_id")
            ids.update([e] if isinstance(e, int) else (e or []))
    return ids


@dataclass(frozen=True)
class TextRules:
    """The request settings that decide its text (vLLM ``SamplingParams`` names and defaults)."""

    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    @classmethod
    def of(cls, params: dict[str, Any]) -> TextRules:
        names = cls.__dataclass_fields__
        kwargs = {k: (tuple([v] if isinstance(v, str) else v) if k in ("stop", "stop_token_ids") else v)
                  for k, v in params.items() if k in names}
        return cls(**kwargs)


@dataclass
class ExpectedText:
    token_ids: list[int]
    text: str
    finish_reason: str
    stop_reason: int | str | None
    pieces: list[str] = field(default_factory=list)  # what each token added before any cut (for messages)


class ReferenceText:
    """The reference tokenizer of a checkpoint and the request semantics above."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_path)
        self.eos_ids, self.primary_eos = checkpoint_eos(model_path), self.tok.eos_token_id
        self.added = {i: t.content for i, t in self.tok.added_tokens_decoder.items()}

    def decode(self, ids: list[int], skip: bool) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)

    def context(self, prompt: list[int]) -> list[int]:
        if len(prompt) > 4:
            for n in range(4, min(len(prompt), 23) + 1):
                if "\ufffd" not in self.decode(prompt[-n:], True):
                    return list(prompt[-n:])
        return list(prompt)

    def pieces(self, prompt: list[int], output: list[int], rules: TextRules) -> list[str]:
        """The text each output token adds (before any stop-string cut)."""
        skip = rules.skip_special_tokens
        window, read = [], 0  # the tokens decoded together; window[:read] is the part already handed out
        for token in self.context(prompt):
            _, window, read = self._advance(window + [token], read, skip)
        out, last_added = [], False
        for token in output:
            piece, window, read = self._advance(window + [token], read, skip)
            if not skip and not rules.spaces_between_special_tokens and self.added:
                content = self.added.get(token)
                if content is not None and last_added:
                    piece = content
                last_added = content is not None
            out.append(piece)
        return out

    def _advance(self, window: list[int], read: int, skip: bool) -> tuple[str, list[int], int]:
        """The window with a new last token: (the text it adds, the next window, its part handed out)."""
        known, full = self.decode(window[:read], skip), self.decode(window, skip)
        if len(full) <= len(known) or full.endswith("\ufffd"):
            return "", window, read
        if not full.startswith(known):  # restart from the new token alone
            return self._advance(window[-1:], 0, skip)
        return full[len(known) :], window[read:], len(window) - read

    def expected(self, prompt: list[int], trajectory: list[int], params: dict[str, Any]) -> ExpectedText:
        """What the request must return when the engine's choices follow ``trajectory`` (the reference's tokens)."""
        rules = TextRules.of(params)
        stops = set(rules.stop_token_ids) | (set() if rules.ignore_eos else self.eos_ids)
        pieces = self.pieces(prompt, trajectory[: rules.max_tokens], rules)
        text = ""
        for j, token in enumerate(trajectory[: rules.max_tokens]):
            on_stop_token = token in stops and j + 1 > rules.min_tokens
            start = len(text)
            if not on_stop_token or rules.include_stop_str_in_output:
                text += pieces[j]
            if j + 1 <= rules.min_tokens:
                continue
            hits = [(at, s) for s in rules.stop if len(text) > start
                    and (at := text.find(s, max(0, start - len(s) + 1))) >= 0]
            if hits:
                at, s = min(hits)
                cut = text[: at + (len(s) if rules.include_stop_str_in_output else 0)]
                return ExpectedText(trajectory[: j + 1], cut, "stop", s, pieces)
            if on_stop_token:
                reason = None if token == self.primary_eos and not rules.ignore_eos else token
                return ExpectedText(trajectory[: j + 1], text, "stop", reason, pieces)
            if j + 1 == rules.max_tokens:
                break
        return ExpectedText(trajectory[: rules.max_tokens], text, "length", None, pieces)
