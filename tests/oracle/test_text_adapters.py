"""The text capabilities of the OpenAI adapter (run_requests' text and stop_reason, stream_requests over SSE)
against nanovllm_ref's own server: every case of conformance/test_text.py, non-streamed and streamed."""

from __future__ import annotations

import pytest

from conformance.test_text import CASES, STREAMED, TextRun, _case, _check
from golden.load import checkpoint_path
from nanovllm_ref.oracle.openai_adapter import OpenAIAdapter
from nanovllm_ref.oracle.references import golden_reference
from nanovllm_ref.oracle.text_reference import ReferenceText

from ..support.server import MODEL, running_server


@pytest.fixture(scope="module")
def served_run():
    with running_server() as server:
        adapter = OpenAIAdapter(server.base)
        yield TextRun(adapter, golden_reference(MODEL, "float32"), ReferenceText(str(checkpoint_path(MODEL))))


def test_the_openai_adapter_reports_text_finish_and_stop_reasons(served_run):
    failures = []
    for case in CASES:
        for label, c, exp in _case(served_run, case, served_run.results):
            failures += _check(label, c, exp)
            if c.stop_reason != exp.stop_reason:
                failures.append(f"{label}: stop_reason {c.stop_reason!r}, expected {exp.stop_reason!r}")
    assert not failures, "\n".join(failures)


def test_the_openai_adapter_streams_pieces_that_add_up_to_the_text(served_run):
    failures = []
    for case in STREAMED:
        for label, s, exp in _case(served_run, case, served_run.streamed):
            failures += _check(label, s.completion, exp)
            if "".join(s.pieces) != exp.text or s.completion.stop_reason != exp.stop_reason:
                failures.append(f"{label}: pieces {s.pieces}, stop_reason {s.completion.stop_reason!r}; expected "
                                f"{exp.text!r}, {exp.stop_reason!r}")
    assert not failures, "\n".join(failures)
