"""Detokenization and stop strings: one IncrementalDetokenizer per sequence, for every request (vLLM's policy).

The text policy (vLLM v1: vllm/v1/engine/detokenizer.py, vllm/transformers_utils/detokenizer_utils.py):

- The text of a sequence is the text its output tokens add to its prompt's: decoding is primed with a suffix of
  the prompt (the shortest of 4 to 23 tokens that decodes without U+FFFD, else the whole prompt, as vLLM primes
  its DecodeStream), so a tokenizer whose decoding depends on the left (a word-level decoder joining tokens with
  spaces, SentencePiece's "▁" word starts) gives every request of that prompt the same text, whatever its other
  options (stop strings, streaming, n). The decoder is the tokenizer's own (tokenizers' `Tokenizer.decode`;
  transformers' `clean_up_tokenization_spaces` is not applied, as in vLLM's fast detokenizer).
- `skip_special_tokens` drops special tokens from the text (the token ids keep every token). With special tokens
  kept and `spaces_between_special_tokens` false, an added token right after another added token contributes its
  bare content (no space a joining decoder would put between them).
- Text grows token by token; while the decoding of the newest tokens ends in U+FFFD (a multi-byte character
  whose bytes are not all there) nothing is added, so the text never ends inside a character, and a character
  left incomplete when the sequence ends is not in the text (vLLM never flushes it). Where the decoding of the
  newest tokens no longer starts with the text already given for them (byte-fallback tokens whose run turns out
  invalid: the decoder then replaces the whole run, given part included), decoding starts over from the new token
  alone (tokenizers' DecodeStream refuses the step; vLLM starts a new stream).
- A sequence that ends on a stop token (EOS or one of `stop_token_ids`) has that token's text left out unless
  `include_stop_str_in_output`.
- Stop strings are searched once more than `min_tokens` tokens were generated, in the new text and the
  len(stop) - 1 characters before it (a stop string may span tokens, and begin in the text of the first
  min_tokens tokens); the one that starts earliest wins (vLLM takes the first in list order that occurs, which
  can leave an earlier stop string in the text); the text is cut before it (after it with
  `include_stop_str_in_output`).
- `stream()` hands out text that can no longer change: while the sequence runs and stop strings are cut from
  the text, all but the last len(longest stop) - 1 characters; everything once it ended. The pieces concatenate
  to the final text and never end inside a character.

The engine feeds a sequence (`feed`) with stop strings every step (its stop check ends it), others when their text
is read (streamed: each step; otherwise once, when the request ends): the same incremental function of the tokens.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..sampling_params import SamplingParams
from .sequence import Sequence

_MIN_CONTEXT, _MAX_CONTEXT = 4, 23  # prompt tokens decoded before the output (vLLM's DecodeStream priming)
_INVALID_PREFIX = "Invalid prefix encountered"  # tokenizers' DecodeStream, when decoding is not monotonic


def prompt_context(decode: Any, prompt_ids: list[int]) -> list[int]:
    """The prompt suffix that primes decoding: the shortest of 4..23 tokens decoding without U+FFFD, else all."""
    for n in range(_MIN_CONTEXT, min(len(prompt_ids), _MAX_CONTEXT) + 1):  # (none below 4 tokens: all of them)
        if "\ufffd" not in decode(prompt_ids[-n:]):
            return list(prompt_ids[-n:])
    return list(prompt_ids)


class _WindowStream:
    """DecodeStream's algorithm over a tokenizer's `decode` (tokenizers without a Rust backend): the text of
    tokens[prefix:read] is known; a token adds what decoding tokens[prefix:] adds to it, once that does not end
    in U+FFFD (vLLM's `detokenize_incrementally`)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.tokens: list[int] = []
        self.prefix = self.read = 0

    def step(self, _tokenizer: Any, token: int) -> str | None:
        self.tokens.append(token)
        known = self.tokenizer.decode(self.tokens[self.prefix : self.read], skip_special_tokens=self.skip)
        full = self.tokenizer.decode(self.tokens[self.prefix :], skip_special_tokens=self.skip)
        if len(full) <= len(known) or full.endswith("\ufffd"):
            return None
        if not full.startswith(known):
            raise ValueError(f"{_INVALID_PREFIX}: {known!r} is not a prefix of {full!r}")
        self.prefix, self.read = self.read, len(self.tokens)
        return full[len(known) :]


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: list[int], params: SamplingParams) -> None:
        self.stop, self.min_tokens = params.stop, params.min_tokens
        self.include_stop = params.include_stop_str_in_output
        self.skip_special = params.skip_special_tokens
        self.backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer of a fast tokenizer
        self.tokenizer = tokenizer
        self.added: dict[int, str] = {}  # added token id -> content, where no space may come between two of them
        if not (params.skip_special_tokens or params.spaces_between_special_tokens):
            self.added = {i: t.content for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
        self.last_added = False
        self.stream_state = self._new_stream()
        decode = partial((tokenizer if self.backend is None else self.backend).decode, skip_special_tokens=True)
        self._pieces(prompt_context(decode, prompt_ids))
        self.last_added = False  # (the prompt's last token does not count, as in vLLM)
        self.num_fed = 0  # output tokens fed
        self.text = ""
        self.hold = max(map(len, self.stop)) - 1 if self.stop and not self.include_stop else 0
        self.streamed = 0
        self.stopped = False  # a stop string ended the text

    def _new_stream(self) -> Any:
        if self.backend is None:
            return _WindowStream(self.tokenizer, self.skip_special)
        from tokenizers.decoders import DecodeStream

        return DecodeStream(skip_special_tokens=self.skip_special)

    def _restart(self, token: int, error: Exception) -> str | None:
        """A decoding that is not monotonic: start over from this token alone (as vLLM)."""
        if not str(error).startswith(_INVALID_PREFIX):
            raise error
        self.stream_state = self._new_stream()
        return self.stream_state.step(self.backend, token)

    def _pieces(self, tokens: list[int]) -> str:
        """The text `tokens` add, one token at a time (a tight loop: every request's every token comes here)."""
        out, step, backend, added = [], self.stream_state.step, self.backend, self.added
        for token in tokens:
            try:
                piece = step(backend, token)
            except Exception as e:
                piece, step = self._restart(token, e), self.stream_state.step
            if added:
                content = added.get(token)
                if content is not None and self.last_added:
                    piece = content
                self.last_added = content is not None
            if piece:
                out.append(piece)
        return "".join(out)

    def add(self, token_ids: list[int], stop_terminated: bool = False) -> str | None:
        """Feed output tokens (`stop_terminated`: the last one is the stop token that ended the sequence); returns
        the stop string that ended the text (nothing is added after it), or None."""
        if self.stopped or not token_ids:
            return None
        skipped = stop_terminated and not self.include_stop
        tokens = token_ids[:-1] if skipped else token_ids
        early = max(0, min(len(tokens), self.min_tokens - self.num_fed))  # tokens within the first min_tokens
        if early:
            self.text += self._pieces(tokens[:early])  # never a stop string's end
        start = len(self.text)
        self.text += self._pieces(tokens[early:])
        self.num_fed += len(token_ids)
        if self.stop and self.num_fed > self.min_tokens and len(self.text) > start:
            return self._find_stop(start)
        return None

    def _find_stop(self, new_from: int) -> str | None:
        hits = [(at, s) for s in self.stop if (at := self.text.find(s, max(0, new_from - len(s) + 1))) >= 0]
        if not hits:
            return None
        at, s = min(hits)  # the earliest stop string in the text wins
        self.text = self.text[: at + (len(s) if self.include_stop else 0)]
        self.stopped = True
        return s

    def stream(self, finished: bool = False) -> str:
        """The next piece of text that can no longer change (all the rest once the sequence `finished` or a stop
        string ended the text)."""
        end = len(self.text) if self.stopped or finished else max(self.streamed, len(self.text) - self.hold)
        piece, self.streamed = self.text[self.streamed : end], end
        return piece


def feed(seq: Sequence) -> str | None:
    """Feed a sequence's detokenizer the output tokens it has not seen (known ones only: a token of a step in flight
    is not in `token_ids` yet, overlap.py); returns the stop string that ended its text, if one did."""
    detok = seq.detokenizer
    if detok is None or detok.num_fed == seq.num_output_tokens:
        return None
    tokens = seq.output_token_ids[detok.num_fed :]
    on_stop_token = seq.is_finished and seq.finish_reason == "stop" and seq.stop_reason is None
    if len(tokens) == 1 or not detok.stop:
        return detok.add(tokens, stop_terminated=on_stop_token)
    # several new tokens (a speculative step) and stop strings: one at a time, so that the output ends at the token
    # that completed a stop string, as it would have one token per step
    for i, token in enumerate(tokens):
        found = detok.add([token], stop_terminated=on_stop_token and i == len(tokens) - 1)
        if found is not None:
            drop = len(tokens) - 1 - i
            if drop:
                del seq.token_ids[-drop:]
                if seq.logprobs is not None:
                    del seq.logprobs[-drop:]
            return found
    return None
