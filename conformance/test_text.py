"""Text conformance: what users read (text, finish_reason, stop_reason, streamed pieces) against the reference.

Any engine whose adapter has ``run_requests`` (nanovllm_ref/oracle/requests.py) takes part; ``stream_requests``
adds the streamed cases, a reported ``stop_reason`` the stop-reason cases (else skipped with the reason). Float32,
greedy, on one checkpoint per tokenizer kind among the selected ones (byte-level BPE, word-level, SentencePiece
with byte fallback; with ``--model``, each named one). What each request must return is derived from the
reference's tokens by nanovllm_ref/oracle/text_reference.py (vLLM's policy, the reference tokenizer):

* golden greedy trajectories of two prompts: plain, special tokens kept; a stop string spanning two tokens
  (listed after one that never occurs), with and without include_stop_str_in_output; two stop strings one
  token completes (one across its boundary, listed first, the rest of its text after it: the first must win and
  neither stay in the text), the spanning one completed by the last
  allowed token, completed inside min_tokens (no stop there), begun inside min_tokens and completed after it
  (a stop); a stop token id (its text left out, or kept with include_stop_str_in_output); n=3 (top_k=1: vLLM
  refuses n > 1 with greedy sampling);
* forced trajectories, the same on any model (logit biases of 50 and 100 dwarf a tiny model's logits, and
  min_tokens masks the stop tokens at first): a token 3 times then EOS (skip_special_tokens on / off,
  include_stop_str_in_output, spaces_between_special_tokens off; a special token where the tokenizer has one
  besides EOS), and a character split over two byte tokens, the second the stop token (text "" without
  include_stop_str_in_output: the incomplete character is never in it);
* seeded sampling over byte tokens of characters split over tokens and two plain tokens (n=3): each sample's
  text is its own tokens'.

Streamed cases: the pieces concatenate to the expected text, and every concatenation of the first pieces is a
prefix of it (no piece ends inside a character, none holds text a stop string later cuts).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from nanovllm_ref.oracle.requests import (
    UNREPORTED,
    RequestSpec,
    UnsupportedSetting,
    supports_requests,
    supports_streaming,
)
from nanovllm_ref.oracle.text_reference import ExpectedText, ReferenceText, TextRules

from .harness import ModelSpec, selected_models

DTYPE = "float32"
LEN = 16  # tokens of the greedy cases
PROMPTS = ("short_12", "block_17", "block_33", "long_70", "short_8", "block_15", "long_130")  # two without EOS
SPLIT_CHARS = "éöüñß—€☃中文😀🙂"  # characters some tokenizer splits over byte tokens
STREAMED = ("plain", "stop-spanning", "stop-spanning-include", "stop-two-in-one-token", "stop-across-min-tokens",
            "stop-token-id",
            "forced-eos-keep-special", "forced-split-char", "forced-split-char-include", "sampled-split-chars-n3")
CASES = ("plain", "plain-keep-special", "stop-spanning", "stop-spanning-include", "stop-two-in-one-token",
         "stop-on-last-token",
         "stop-inside-min-tokens", "stop-across-min-tokens", "stop-token-id", "stop-token-id-include", "n3-stop",
         "forced-eos", "forced-eos-keep-special", "forced-eos-include", "forced-eos-no-spaces", "forced-split-char",
         "forced-split-char-include", "sampled-split-chars-n3")


def text_models(config: pytest.Config) -> list[ModelSpec]:
    """The selected checkpoints, one per tokenizer (by tokenizer.json's hash) unless named with --model."""
    models = selected_models(config)
    if config.getoption("--model"):
        return models
    kinds: dict[str, ModelSpec] = {}
    for m in models:
        f = Path(m.path) / "tokenizer.json"
        kinds.setdefault(hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else m.name, m)
    return list(kinds.values())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "text_model" in metafunc.fixturenames:
        models = text_models(metafunc.config)
        metafunc.parametrize("text_model", models, ids=[m.name for m in models], scope="module")


class TextRun:
    """The cases of one checkpoint, run once (all requests together, then the streamed ones together)."""

    def __init__(self, adapter, ref, rt: ReferenceText) -> None:
        self.adapter, self.ref, self.rt = adapter, ref, rt
        self.specs: dict[str, list[tuple[list[int], list[int] | None, dict]]] = {}  # case -> [(prompt, tokens, params)]
        self.missing: dict[str, str] = {}  # case -> why it cannot be made on this checkpoint
        self._build()
        named = [(case, i) for case, items in self.specs.items() for i in range(len(items))]
        requests = [RequestSpec(self.specs[c][i][0], self.specs[c][i][2]) for c, i in named]
        self.results = dict(zip(named, self._call("run_requests", requests)))
        self.streamed: dict = {}
        if supports_streaming(adapter):
            named = [(c, i) for c, i in named if c in STREAMED]
            requests = [RequestSpec(self.specs[c][i][0], self.specs[c][i][2]) for c, i in named]
            self.streamed = dict(zip(named, self._call("stream_requests", requests)))

    def _call(self, method: str, requests: list[RequestSpec]) -> list:
        try:
            return getattr(self.adapter, method)(requests)
        except UnsupportedSetting as e:
            pytest.skip(f"{self.adapter.name}: {e}")

    def _add(self, case: str, prompt: list[int], trajectory: list[int] | None, **params) -> None:
        self.specs.setdefault(case, []).append((list(prompt), trajectory, params))

    def _build(self) -> None:
        names = [n for n in PROMPTS if n in self.ref.prompt_ids]
        chosen = [n for n in names if not set(self.ref.outputs[self.ref.prompt_ids.index(n)].token_ids)
                  & self.rt.eos_ids][:2]
        assert chosen, f"no prompt among {names} whose reference tokens are free of EOS"
        for name in chosen:
            i = self.ref.prompt_ids.index(name)
            self._greedy_cases(self.ref.prompts[i], self.ref.outputs[i].token_ids)
        prompt = self.ref.prompts[self.ref.prompt_ids.index(chosen[0])]
        self._forced_cases(prompt)
        self.missing = {case: why for case, why in self.missing.items() if case not in self.specs}

    def _greedy_cases(self, prompt: list[int], traj: list[int]) -> None:
        greedy = {"temperature": 0.0, "max_tokens": LEN, "ignore_eos": True}
        self._add("plain", prompt, traj, **greedy)
        self._add("plain-keep-special", prompt, traj, **greedy, skip_special_tokens=False)
        stop, j = spanning_stop(self.rt.pieces(prompt, traj[:LEN], TextRules()))
        stop_cases = (("stop-spanning", {}), ("stop-spanning-include", {"include_stop_str_in_output": True}),
                      ("stop-on-last-token", {"max_tokens": j + 1}), ("stop-inside-min-tokens", {"min_tokens": j + 1}),
                      ("stop-across-min-tokens", {"min_tokens": j}),
                      ("n3-stop", {"n": 3, "temperature": 1.0, "top_k": 1, "seed": 7}))  # (vLLM: greedy means n=1)
        for case, extra in stop_cases:
            if stop is None:
                self.missing[case] = "no two neighbouring tokens with text on both sides"
            else:
                self._add(case, prompt, traj, **{**greedy, "stop": ["\x00never", stop], **extra})
        pair = two_stops_in_one_token(self.rt.pieces(prompt, traj[:LEN], TextRules()))
        if pair is None:
            self.missing["stop-two-in-one-token"] = "no token with text on both sides of a boundary and after it"
        else:  # listed in text order (vLLM takes the first listed that occurs, nanovllm_ref the earliest)
            self._add("stop-two-in-one-token", prompt, traj, **greedy, stop=["\x00never", *pair])
        k = next((i for i in range(3, len(traj)) if traj[i] not in traj[:i]), None)
        for case, extra in (("stop-token-id", {}), ("stop-token-id-include", {"include_stop_str_in_output": True})):
            if k is None:
                self.missing[case] = "no token from the fourth on that is new"
            else:
                self._add(case, prompt, traj, **greedy, stop_token_ids=[traj[k]], **extra)

    def _forced_cases(self, prompt: list[int]) -> None:
        eos, tok = self.rt.primary_eos, self.rt.tok
        specials = sorted({i for i, t in tok.added_tokens_decoder.items() if t.special} - self.rt.eos_ids)
        plain = self.ref.outputs[0].token_ids[:2]
        other = specials[-1] if specials else plain[0]
        if eos is None:
            why = "the tokenizer has no EOS"
            self.missing.update(dict.fromkeys([c for c in CASES if c.startswith("forced-eos")], why))
        else:
            forced = {"temperature": 0.0, "max_tokens": 8, "min_tokens": 3, "logit_bias": {other: 50.0, eos: 100.0}}
            traj = [other] * 3 + [eos]
            self._add("forced-eos", prompt, traj, **forced)
            self._add("forced-eos-keep-special", prompt, traj, **forced, skip_special_tokens=False)
            self._add("forced-eos-include", prompt, traj, **forced, skip_special_tokens=False,
                      include_stop_str_in_output=True)
            self._add("forced-eos-no-spaces", prompt, traj, **forced, skip_special_tokens=False,
                      spaces_between_special_tokens=False, include_stop_str_in_output=True)
        splits = split_characters(self.rt)
        if not splits:
            why = "the tokenizer splits none of the characters " + SPLIT_CHARS + " over two byte tokens"
            self.missing.update(dict.fromkeys([c for c in CASES if "split" in c], why))
            return
        a, b = splits[0]
        forced = {"temperature": 0.0, "max_tokens": 4, "min_tokens": 1, "ignore_eos": True,
                  "logit_bias": {a: 50.0, b: 100.0}, "stop_token_ids": [b]}
        self._add("forced-split-char", prompt, [a, b], **forced)
        self._add("forced-split-char-include", prompt, [a, b], **forced, include_stop_str_in_output=True)
        bias = {t: 100.0 for t in [*plain, *(t for pair in splits for t in pair)]}  # (plain: runs of bytes end)
        self._add("sampled-split-chars-n3", prompt, None, temperature=1.0, seed=1234, n=3, max_tokens=12,
                  ignore_eos=True, logit_bias=bias)


def spanning_stop(pieces: list[str]) -> tuple[str | None, int]:
    """A 2-character stop string across the boundary before token j (the last character of the text before it,
    the first of token j's), at its first occurrence in the text; (None, -1) if no boundary qualifies."""
    text = "".join(pieces)
    for j in range(1, len(pieces) - 2):
        before = "".join(pieces[:j])
        if before and pieces[j] and before[-1].strip() and pieces[j][0].strip():
            stop = before[-1] + pieces[j][0]
            if text.find(stop) == len(before) - 1:
                return stop, j
    for j in range(1, len(pieces) - 2):  # a word-level text: a space starts every token
        before = "".join(pieces[:j])
        if before and len(pieces[j]) > 1:
            stop = before[-1] + pieces[j][:2]
            if text.find(stop) == len(before) - 1:
                return stop, j
    return None, -1


def two_stops_in_one_token(pieces: list[str]) -> tuple[str, str] | None:
    """Two stop strings one token completes, both first occurring there: A across the boundary before it, B the
    rest of its text after A. A must win, and none may stay in the text (a search for stops only at the end of
    the text finds B alone and leaves A in)."""
    text = "".join(pieces)
    for j in range(1, len(pieces)):
        before, piece = "".join(pieces[:j]), pieces[j]
        k = 1 if piece[:1].strip() else 2  # a word-level token begins with its space
        a, b = before[-1:] + piece[:k], piece[k:]
        if (before[-1:].strip() and piece[k - 1:k].strip() and b.strip() and text.find(a) == len(before) - 1
                and text.find(b) == len(before) + k):
            return a, b
    return None


def split_characters(rt: ReferenceText) -> list[tuple[int, int]]:
    """(first, second) token pairs of characters the tokenizer encodes as two tokens that alone decode to U+FFFD."""
    pairs = []
    for ch in SPLIT_CHARS:
        ids = [t for t in rt.tok.encode(ch, add_special_tokens=False) if rt.decode([t], True).strip()]
        if len(ids) == 2 and all("\ufffd" in rt.decode([t], True) for t in ids) and rt.decode(ids, True) == ch:
            pairs.append((ids[0], ids[1]))
    return pairs


@pytest.fixture(scope="module")
def text_run(text_model: ModelSpec, engines, references) -> TextRun:
    adapter = engines.get(text_model, DTYPE)
    if not supports_requests(adapter):
        pytest.skip(f"engine {adapter.name} has no run_requests (oracle/requests.py): text cases need it")
    return TextRun(adapter, references.get(text_model, DTYPE), ReferenceText(text_model.path))


def _case(run: TextRun, case: str, results: dict) -> list[tuple[str, object, ExpectedText]]:
    """(label, completion, expected) of every completion of the case."""
    if case in run.missing:
        pytest.skip(f"{case}: {run.missing[case]}")
    out = []
    for i, (prompt, traj, params) in enumerate(run.specs[case]):
        for k, c in enumerate(results[(case, i)]):
            got = c.completion if hasattr(c, "completion") else c
            expected = run.rt.expected(prompt, traj if traj is not None else got.token_ids, params)
            if traj is None and not set(got.token_ids) <= set(params["logit_bias"]):  # sampled: biased tokens only
                expected.token_ids = [t for t in got.token_ids if t in params["logit_bias"]]
            out.append((f"{case}[prompt {i}, sample {k}] {params}", c, expected))
    return out


def _check(label: str, got, expected: ExpectedText) -> list[str]:
    if got.text is None:
        pytest.skip("the engine returns no text")
    wrong = []
    if list(got.token_ids) != expected.token_ids:
        wrong.append(f"tokens {list(got.token_ids)}, the reference's {expected.token_ids}")
    if got.text != expected.text:
        wrong.append(f"text {got.text!r}, expected {expected.text!r} (pieces {expected.pieces})")
    if got.finish_reason != expected.finish_reason:
        wrong.append(f"finish_reason {got.finish_reason!r}, expected {expected.finish_reason!r}")
    return [f"{label}: " + "; ".join(wrong)] if wrong else []


@pytest.mark.parametrize("case", CASES)
def test_text(text_run: TextRun, case: str) -> None:
    """Tokens, text and finish_reason of each request are what the reference's tokens imply."""
    failures = [f for label, c, exp in _case(text_run, case, text_run.results) for f in _check(label, c, exp)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", CASES)
def test_stop_reason(text_run: TextRun, case: str) -> None:
    """stop_reason: the stop string or stop token id that ended the request, None for EOS and length (vLLM)."""
    checked = _case(text_run, case, text_run.results)
    if any(c.stop_reason is UNREPORTED for _, c, _ in checked):
        pytest.skip(f"engine {text_run.adapter.name} reports no stop_reason")
    failures = [f"{label}: stop_reason {c.stop_reason!r}, expected {exp.stop_reason!r}"
                for label, c, exp in checked if c.stop_reason != exp.stop_reason]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", STREAMED)
def test_streamed_text(text_run: TextRun, case: str) -> None:
    """Streamed: each concatenation of the first pieces is a prefix of the expected text, and all of them are it."""
    if not supports_streaming(text_run.adapter):
        pytest.skip(f"engine {text_run.adapter.name} has no stream_requests (oracle/requests.py)")
    failures = []
    for label, s, exp in _case(text_run, case, text_run.streamed):
        failures += _check(label + " (streamed)", s.completion, exp)
        sent = ""
        for n, piece in enumerate(s.pieces):
            sent += piece
            if not exp.text.startswith(sent):
                failures.append(f"{label}: the first {n + 1} pieces {s.pieces[:n + 1]} are no prefix of the "
                                f"expected text {exp.text!r}")
                break
        if sent != exp.text:
            failures.append(f"{label}: the pieces {s.pieces} add up to {sent!r}, expected {exp.text!r}")
    assert not failures, "\n".join(failures)
