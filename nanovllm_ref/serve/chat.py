"""`nanovllm-ref chat MODEL`: a conversation in the terminal, replies streamed (as `ollama run`, `llama-cli -cnv`).

- `/exit` (also `/bye`, `exit`, `quit`) or Ctrl-D quits; `/clear` forgets the conversation; `/?` lists the
  commands. A line starting with `/` is a command, never sent to the model; an empty line is ignored.
- Ctrl-C while a reply streams stops it: the request is aborted between two engine steps (never inside one), the
  part shown stays in the conversation. Ctrl-C at the prompt says how to quit.
- When the conversation + `--max-tokens` would not fit the context (max_model_len), the oldest turns are dropped
  (a system message stays) with a notice; if the newest message alone leaves too little room, the reply is
  capped, and a message that cannot fit at all is not sent. The session goes on in every case.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

from ..chat_template import render_chat
from ..sampling_params import RequestOutputKind, SamplingParams

QUIT = ("/exit", "/bye", "/quit", "exit", "quit")
HELP = ("/exit, /bye, Ctrl-D   quit\n/clear                forget the conversation\n"
        "/?, /help             this list\nCtrl-C                stop the reply being written")


class _CtrlC:
    """While a reply streams, SIGINT only raises a flag that the loop reads between engine steps."""

    def __enter__(self) -> _CtrlC:
        self.pressed, self.previous = False, None
        try:
            self.previous = signal.signal(signal.SIGINT, self._note)
        except ValueError:  # not the main thread: Ctrl-C keeps its default meaning
            pass
        return self

    def _note(self, *_: object) -> None:
        self.pressed = True

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


class ChatSession:
    def __init__(self, llm: Any, params: SamplingParams, template: str | None, name: str) -> None:
        self.llm, self.params, self.template, self.name = llm, params, template, name
        self.tok = llm.tokenizer
        self.max_len = llm.engine.spec.max_model_len
        self.messages: list[dict] = []

    def run(self) -> int:
        say(f"chatting with {self.name} ({self.max_len}-token context, replies of up to {self.params.max_tokens} "
            "tokens)\n/exit or Ctrl-D quits, /clear starts over, Ctrl-C stops a reply, /? lists the commands")
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                print(flush=True)
                return 0
            except KeyboardInterrupt:
                say("\n(/exit or Ctrl-D quits)")
                continue
            if line.lower() in QUIT:
                return 0
            if line in ("/clear", "/reset"):
                self.messages.clear()
                say("(conversation cleared)")
            elif line in ("/?", "/help"):
                say(HELP)
            elif line.startswith("/"):
                say(f"(unknown command {line.split()[0]}; /? lists the commands)")
            elif line:
                self.turn(line)

    def turn(self, line: str) -> None:
        fitted = self.fit([*self.messages, {"role": "user", "content": line}])
        if fitted is None:  # not sent: the conversation stays as it was
            return
        messages, ids, params = fitted
        reply, finish = self.stream(ids, params)
        if finish == "error" or (finish == "abort" and not reply):
            return  # nothing was answered: the message is not part of the conversation
        self.messages = [*messages, {"role": "assistant", "content": reply}]

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        text = render_chat(self.tok, messages, self.template, add_generation_prompt=True)
        return list(self.tok.encode(text, add_special_tokens=False))

    def fit(self, messages: list[dict]) -> tuple[list[dict], list[int], SamplingParams] | None:
        """(the messages to send, their prompt, the sampling params): the oldest turns dropped as needed, and the
        reply capped when the newest message alone leaves too little room; None (with a notice) if it cannot fit."""
        ids, params, dropped = self.prompt_ids(messages), self.params, 0
        first = 1 if messages[0]["role"] == "system" else 0
        while len(ids) + params.max_tokens > self.max_len:
            if len(messages) - first <= 1:  # only the newest message left: a shorter reply, or none
                room = self.max_len - len(ids)
                if room < 1:
                    say(f"(this message is {len(ids)} tokens with the chat template; the context holds "
                        f"{self.max_len}: not sent)")
                    return None
                say(f"(the reply is capped at {room} tokens to fit the {self.max_len}-token context)")
                params = dataclasses.replace(params, max_tokens=room)
                break
            messages = messages[:first] + messages[first + 1:]  # a user turn, then its reply, ...
            dropped += 1
            while len(messages) - first > 1 and messages[first]["role"] != "user":
                messages = messages[:first] + messages[first + 1:]
                dropped += 1
            ids = self.prompt_ids(messages)
        try:
            self.llm.engine.validate_request(ids, params)  # e.g. a KV cache smaller than max_model_len
        except ValueError as e:
            say(f"(not sent: {e})")
            return None
        if dropped:
            say(f"(context full: dropped the {dropped} oldest messages to fit {self.max_len} tokens)")
        return messages, ids, params

    def stream(self, ids: list[int], params: SamplingParams) -> tuple[str, str]:
        """Stream one reply (the engine's DELTA outputs); (its text, its finish reason: "abort" when Ctrl-C stopped
        it)."""
        rid = self.llm.add_request(ids, dataclasses.replace(params, output_kind=RequestOutputKind.DELTA))
        shown = ""
        print("assistant> ", end="", flush=True)
        with _CtrlC() as ctrl_c:
            while True:
                out = next((o for o in self.llm.step() if o.request_id == rid), None)
                if out is not None and out.finished:
                    break
                if out is not None:
                    shown += out.text  # text that can no longer change: the final text goes on from it
                    print(out.text, end="", flush=True)
                if ctrl_c.pressed:
                    self.llm.abort_request(rid)
                    say(" [stopped]")
                    return shown, "abort"
        if out.finish_reason == "error":
            say(f"\n(the engine failed this reply: {out.error})")
            return "", "error"
        say(out.text)
        return shown + out.text, out.finish_reason or "stop"

def say(text: str) -> None:
    print(text, flush=True)
