"""The server's streamed text (serve/handlers.Choice passing on the engine's detokenizer pieces) with the golden
byte-level BPE tokenizer: pieces never split a multi-byte UTF-8 character and add up to the engine's final text;
a possible stop string is held back while the request runs, and the engine's stop (trimmed like vLLM, min_tokens
aware) is what the stream ends with."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanovllm_ref import SamplingParams
from nanovllm_ref.engine.detokenizer import IncrementalDetokenizer
from nanovllm_ref.loader import load_tokenizer
from nanovllm_ref.outputs import CompletionOutput, RequestOutput
from nanovllm_ref.serve.engine_loop import Delta
from nanovllm_ref.serve.handlers import Choice

from ..conftest import QWEN3, checkpoint_path

TEXT = "héllo wörld — ☃ 😀 ok"
PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(checkpoint_path(QWEN3)))


def _choice(tok, params: SamplingParams) -> Choice:
    return Choice(0, 0, PROMPT)


class _Engine:
    """The engine's side of one request: its detokenizer fed each step (stop strings checked), Deltas carrying
    the pieces of the engine's DELTA outputs (IncrementalDetokenizer.stream), then the RequestOutput with the final
    text."""

    def __init__(self, tok, params: SamplingParams) -> None:
        self.detok, self.params, self.ids = IncrementalDetokenizer(tok, PROMPT, params), params, []

    def delta(self, ids: list[int]) -> Delta:
        self.ids += ids
        self.detok.add(ids)
        return Delta(0, ids, None, text=self.detok.stream())

    def output(self, ids: list[int]) -> RequestOutput:
        self.detok.add(ids[len(self.ids):])
        text = self.detok.text
        sample = CompletionOutput(0, list(ids), text, "stop" if self.params.stop else "length")
        return RequestOutput("r", PROMPT, list(ids), text, sample.finish_reason, outputs=[sample])


def _engine_output(tok, ids: list[int], params: SamplingParams) -> RequestOutput:
    """What the engine returns for output `ids` (cut at its stop string)."""
    detok = IncrementalDetokenizer(tok, PROMPT, params)
    for i, token in enumerate(ids):
        if detok.add([token]):
            ids = ids[: i + 1]
            break
    return _Engine(tok, params).output(ids)


def _stream(tok, ids: list[int], params: SamplingParams, chunk: int = 1, sent: int | None = None) -> list[str]:
    """The pieces a choice streams when the engine delivers ids[:sent] in Deltas of `chunk` tokens, then ends."""
    choice, engine, sent = _choice(tok, params), _Engine(tok, params), len(ids) if sent is None else sent
    pieces = [choice.absorb(engine.delta(ids[i:min(i + chunk, sent)])) for i in range(0, sent, chunk)]
    final = _engine_output(tok, ids, params)
    pieces.append(choice.absorb(final))
    assert "".join(pieces) == choice.text == final.text and choice.finish_reason is not None
    return pieces


def test_multibyte_characters_split_across_tokens_are_never_split_in_the_stream(tok):
    ids = tok.encode(TEXT)
    assert any(tok.decode([i]) == "\ufffd" for i in ids)  # the fixture does split characters into byte tokens
    pieces = _stream(tok, ids, SamplingParams())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=30),
       st.integers(1, 4))
def test_any_text_streams_back_whole_in_any_chunking(tok, text, chunk):
    ids = tok.encode(text)
    pieces = _stream(tok, ids, SamplingParams(), chunk)
    assert "".join(pieces) == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in tok.decode(ids)


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_is_held_back_then_the_engine_trims_it(tok, include):
    ids = tok.encode("import os\nimport sys\n")
    params = SamplingParams(stop=("sys",), include_stop_str_in_output=include)
    stop_token = next(i for i in range(len(ids)) if tok.decode(ids[: i + 1]).endswith("sys"))
    pieces = _stream(tok, ids, params, sent=stop_token)  # the engine finishes the request in the stop's step
    assert "s" not in "".join(pieces[:-1])[len("import os\nimport "):]  # not even the stop's first letter early
    assert "".join(pieces) == "import os\nimport " + ("sys" if include else "")


def test_held_back_text_that_is_no_stop_is_released(tok):
    ids = tok.encode("abc START")
    params = SamplingParams(stop=("STOP",))
    choice, engine = _choice(tok, params), _Engine(tok, params)
    early = "".join(choice.absorb(engine.delta([t])) for t in ids)
    assert "abc START".startswith(early) and len(early) >= len("abc START") - 3  # at most len("STOP") - 1 held
    assert early + choice.absorb(_engine_output(tok, ids, params)) == "abc START"


def test_min_tokens_lets_an_early_stop_string_pass_and_the_stream_ends_at_the_engines(tok):
    ids = tok.encode("import sys\nimport os\nimport sys")  # ... 'import', ' sys'
    params = SamplingParams(stop=("rt sys",), min_tokens=len(ids) - 1)
    pieces = _stream(tok, ids, params, sent=len(ids) - 1)
    assert "".join(pieces[:-1]).startswith("import sys\nimport os\n")  # the first "rt sys" was streamed
    assert "".join(pieces) == "import sys\nimport os\nimpo"  # the engine stopped at the second
