"""The chat session's context policy, in-process: oldest turns dropped in pairs with a system message kept, a
reply capped when the newest message alone leaves too little room, and a message that cannot fit not sent with
the conversation left exactly as it was."""

from __future__ import annotations

import pytest

from golden.load import resolve_model
from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.chat_template import BUILTIN
from nanovllm_ref.serve.chat import ChatSession

MAX_LEN, MAX_TOKENS = 96, 24


@pytest.fixture(scope="module")
def llm():
    with LLM(resolve_model("qwen3-tiny"), dtype="float32", max_model_len=MAX_LEN) as llm:
        yield llm


@pytest.fixture
def session(llm):
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    return ChatSession(llm, params, BUILTIN["chatml"], "qwen3-tiny")


def test_overflow_drops_the_oldest_turns_and_keeps_the_system_message(session, capsys):
    session.messages = [{"role": "system", "content": "be brief"}]
    for i in range(4):
        session.turn(f"message {i}")
        assert session.messages[-2:][0] == {"role": "user", "content": f"message {i}"}  # sent and answered
        assert session.messages[-1]["role"] == "assistant"
    out = capsys.readouterr().out
    assert "context full: dropped the 2 oldest messages" in out
    assert session.messages[0]["role"] == "system" and session.messages[-2:][0]["content"] == "message 3"
    roles = [m["role"] for m in session.messages[1:]]
    assert roles == ["user", "assistant"] * (len(roles) // 2)  # whole turns only


def test_a_message_that_cannot_fit_leaves_the_conversation_as_it_was(session, capsys):
    session.turn("hello")
    before = list(session.messages)
    session.turn("y" * 300)
    assert "not sent" in capsys.readouterr().out and session.messages == before


def test_a_long_message_alone_gets_a_capped_reply(session, capsys):
    def room(message: str) -> int:
        return MAX_LEN - len(session.prompt_ids([{"role": "user", "content": message}]))

    message = next(m for m in ("z " * n for n in range(1, MAX_LEN)) if 1 <= room(m) < MAX_TOKENS // 2)
    session.turn(message)
    assert f"capped at {room(message)} tokens" in capsys.readouterr().out
    assert session.messages[-1]["role"] == "assistant"
