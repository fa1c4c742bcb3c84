"""`nanovllm-ref chat` in a pseudo-terminal, as a person uses it: the banner says how to quit; a conversation
longer than the context loses its oldest turns with a notice and goes on; Ctrl-C stops a reply being written and
the session goes on; Ctrl-C at the prompt only says how to quit; `exit` quits instead of reaching the model."""

from __future__ import annotations

import os
import sys
import time

import pytest

from .pty_session import PtySession

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
       "TERM": "dumb"}
PROMPT = r"you> "


@pytest.fixture
def chat(tmp_path):
    """Start `nanovllm-ref chat qwen3-tiny ...` (a golden name, from a folder that is not the repository)."""
    sessions = []

    def start(*flags: str) -> PtySession:
        argv = [sys.executable, "-m", "nanovllm_ref.serve.cli", "chat", "qwen3-tiny", "--dtype", "float32",
                "--chat-template", "chatml", "--ignore-eos", *flags]  # the built-in ChatML
        sessions.append(PtySession(argv, ENV, str(tmp_path)))
        return sessions[-1]

    yield start
    for s in sessions:
        s.close()


def test_a_conversation_longer_than_the_context_drops_its_oldest_turns_and_goes_on(chat):
    s = chat("--max-model-len", "96", "--max-tokens", "24")
    banner = s.expect(PROMPT)
    assert "/exit" in banner and "Ctrl-D" in banner and "96-token context" in banner
    notices = ""
    for i in range(6):  # each turn adds ~35 tokens: the third already overflows 96
        s.type(f"message number {i}\n")
        notices += s.expect(PROMPT)
        assert notices.count("assistant> ") == i + 1, notices  # every message got its reply
    assert "context full: dropped the 2 oldest messages" in notices
    s.type("x" * 200 + "\n")  # cannot fit at all: refused, the session goes on
    assert "not sent" in s.expect(PROMPT)
    s.type("/nonsense\n")
    assert "unknown command /nonsense" in s.expect(PROMPT)
    s.type("exit\n")  # quits: never sent to the model
    assert s.wait() == 0
    assert "assistant> " not in s.output[s.seen:]


def test_ctrl_c_stops_the_reply_and_keeps_the_session(chat):
    s = chat("--max-model-len", "2048", "--max-tokens", "2000")
    s.expect(PROMPT)
    # readline shows the prompt before CPython's input loop waits in select(): a SIGINT in between only sets
    # Python's flag and select() sleeps on until the next key (a CPython race a person typing never hits); give
    # the loop a moment to reach its wait before pressing Ctrl-C
    time.sleep(0.5)
    s.type("\x03")  # at the prompt: only a hint
    assert "/exit or Ctrl-D quits" in s.expect(PROMPT)
    for _ in range(2):  # a reply stopped twice in a row: each time the session goes on
        s.type("write a long story\n")
        s.expect(r"assistant> \s*\S")  # the reply has started streaming
        s.type("\x03")
        reply = s.expect(PROMPT)
        assert "[stopped]" in reply and "Traceback" not in reply
    s.type("/clear\n")
    assert "conversation cleared" in s.expect(PROMPT)
    s.type("\x04")  # Ctrl-D
    assert s.wait() == 0
    assert "Traceback" not in s.output


def test_ctrl_c_with_tensor_parallel_ranks_stops_the_reply_not_the_ranks(chat):
    """The terminal sends Ctrl-C to every process of the group, TP ranks included: they must ignore it."""
    s = chat("--max-model-len", "2048", "--max-tokens", "2000", "--config", '{"tensor_parallel_size": 2}')
    s.expect(PROMPT, timeout=180)
    s.type("write a long story\n")
    s.expect(r"assistant> \s*\S")
    s.type("\x03")
    assert "[stopped]" in s.expect(PROMPT)
    s.type("and another\n")  # the ranks still answer
    s.expect(r"assistant> \s*\S")
    s.type("\x03")
    assert "[stopped]" in s.expect(PROMPT)
    s.type("/exit\n")
    assert s.wait() == 0
    assert "Traceback" not in s.output
