"""The server's incremental detokenizer (serve/text.py) with the golden byte-level BPE tokenizer: streamed text
never splits a multi-byte UTF-8 character and adds up to the whole decode; stop strings are held back while
they may be starting, and trimmed like vLLM."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanovllm_ref.engine.loading import load_tokenizer
from nanovllm_ref.serve.text import TextStream

from .conftest import QWEN3, checkpoint_path

TEXT = "héllo wörld — ☃ 😀 ok"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(checkpoint_path(QWEN3)))


def test_multibyte_characters_split_across_tokens_are_never_split_in_the_stream(tok):
    ids = tok.encode(TEXT)
    assert any(tok.decode([i]) == "\ufffd" for i in ids)  # the fixture does split characters into byte tokens
    stream = TextStream(tok)
    deltas = [stream.add([i]) for i in ids] + [stream.finish()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT == stream.text


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), max_size=30),
       st.integers(1, 4))
def test_any_text_streams_back_whole_in_any_chunking(tok, text, chunk):
    ids = tok.encode(text)
    stream = TextStream(tok)
    deltas = [stream.add(ids[i:i + chunk]) for i in range(0, len(ids), chunk)] + [stream.finish()]
    assert "".join(deltas) == tok.decode(ids)
    assert all("\ufffd" not in d for d in deltas) or "\ufffd" in tok.decode(ids)


def test_stop_strings_are_held_back_then_trimmed(tok):
    ids = tok.encode("import os\nimport sys\n")
    stream = TextStream(tok, stop=("sys",))
    out = ""
    for i in ids:
        out += stream.add([i])
        assert "s" not in out[len("import os\nimport "):]  # not even the stop's first letter is shown early
    out += stream.finish()
    assert out == "import os\nimport " and stream.stopped
    assert stream.ids == ids[:len(stream.ids)] and tok.decode(stream.ids).endswith("sys")
    kept = TextStream(tok, stop=("sys", "os\n"), include_stop=True)
    assert kept.add(ids) + kept.finish() == "import os\n"  # the earliest stop wins, kept in the text


def test_text_that_only_looks_like_a_stop_start_is_released(tok):
    stream = TextStream(tok, stop=("STOP",))
    held = stream.add(tok.encode("abc ST"))
    assert held == "abc " and not stream.stopped
    assert stream.add(tok.encode("ART")) == "START" and stream.finish() == ""


def test_with_the_engine_applying_stop_strings_the_stream_only_holds_back_then_settles(tok):
    ids = tok.encode("import sys\nimport os\nimport sys")  # ... 'import', ' sys'
    stream = TextStream(tok, stop=("rt sys",), detect=False)  # e.g. min_tokens: the engine went past the first
    sent = stream.add(ids[:-1])
    assert sent == "import sys\nimport os\nimpo" and not stream.stopped  # "rt" may begin the stop: held back
    engine_text = "import sys\nimport os\nimpo"  # the engine stopped at the second "rt sys"
    assert stream.settle(ids[-1:], engine_text) == "" and stream.text == engine_text and stream.ids == ids
    kept = TextStream(tok, stop=("rt sys",), detect=False)
    assert kept.add(ids[:-1]) + kept.settle(ids[-1:], engine_text + "rt sys") == engine_text + "rt sys"
