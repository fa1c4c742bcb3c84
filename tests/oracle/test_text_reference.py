"""oracle/text_reference.py on hand-made trajectories of the golden BPE tokenizer: what vLLM's policy says a
request returns (text, finish_reason, stop_reason, tokens) in each rule's corner."""

from __future__ import annotations

import pytest

from golden.load import checkpoint_path
from nanovllm_ref.oracle.text_reference import ReferenceText


@pytest.fixture(scope="module")
def rt() -> ReferenceText:
    return ReferenceText(str(checkpoint_path("qwen3-tiny")))


def test_plain_stop_string_and_include(rt):
    out = rt.tok.encode("import os\nimport sys\nx = 1\n")
    cut = rt.expected([5], out, {"max_tokens": 32, "stop": ["never", "sys"]})
    assert (cut.text, cut.finish_reason, cut.stop_reason) == ("import os\nimport ", "stop", "sys")
    assert rt.tok.decode(cut.token_ids).endswith("sys")
    kept = rt.expected([5], out, {"max_tokens": 32, "stop": "sys", "include_stop_str_in_output": True})
    assert kept.text == "import os\nimport sys" and kept.token_ids == cut.token_ids
    plain = rt.expected([5], out, {"max_tokens": 3})
    assert (plain.finish_reason, plain.stop_reason, plain.token_ids) == ("length", None, out[:3])


def test_min_tokens_hides_a_stop_string_completed_inside_them(rt):
    out = rt.tok.encode("import os\nimport sys\nimport os\n")
    first = next(i for i in range(len(out)) if rt.tok.decode(out[: i + 1]).endswith("os"))
    late = rt.expected([5], out, {"max_tokens": 32, "stop": "os", "min_tokens": first + 1})
    assert late.text == "import os\nimport sys\nimport " and late.finish_reason == "stop"
    early = rt.expected([5], out, {"max_tokens": 32, "stop": "os", "min_tokens": first})
    assert early.text == "import " and early.token_ids == out[: first + 1]


def test_stop_tokens_eos_and_the_last_allowed_token(rt):
    out = rt.tok.encode("a b c")
    by_id = rt.expected([5], out + [0], {"max_tokens": 8, "stop_token_ids": [out[1]]})
    assert (by_id.text, by_id.stop_reason, by_id.token_ids) == ("a", out[1], out[:2])
    eos = rt.expected([5], out + [0], {"max_tokens": 8, "skip_special_tokens": False})
    assert (eos.text, eos.finish_reason, eos.stop_reason) == ("a b c", "stop", None)
    shown = rt.expected([5], out + [0], {"max_tokens": 8, "skip_special_tokens": False,
                                         "include_stop_str_in_output": True})
    assert shown.text == "a b c<|endoftext|>"
    ignored = rt.expected([5], out + [0], {"max_tokens": len(out) + 1, "ignore_eos": True})
    assert (ignored.finish_reason, ignored.token_ids) == ("length", out + [0])
    last = rt.expected([5], out, {"max_tokens": 2, "stop": " b"})
    assert (last.finish_reason, last.stop_reason, last.text) == ("stop", " b", "a")
