"""Chat templates: `--chat-template` (serve and chat) given as a file or as the template text itself, and the
one renderer of a conversation into prompt text (the server, `nanovllm-ref chat` and `LLM.chat` share it)."""

from __future__ import annotations

import os
from typing import Any

# ChatML (Qwen's format), built in so that `--chat-template chatml` works from any folder for checkpoints that
# ship no template (the golden ones)
BUILTIN = {"chatml": (
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n")}


def read_chat_template(value: str | None) -> str | None:
    """`--chat-template`: a file's contents, the value itself when it is a Jinja template, or a built-in
    template's (`chatml`) when no such file exists."""
    if value is None or "{{" in value or "{%" in value:
        return value
    if not os.path.isfile(value) and value in BUILTIN:
        return BUILTIN[value]
    if not os.path.isfile(value):
        raise ValueError(f"--chat-template: no such file {value!r} (and not a Jinja template, nor one of "
                         f"{sorted(BUILTIN)})")
    with open(value) as f:
        return f.read()


def render_chat(tokenizer: Any, conversation: list[dict], chat_template: str | None = None, **options: Any) -> str:
    """A conversation's prompt text through the chat template; message content is text or a list of text parts.
    `options` go to `apply_chat_template` (add_generation_prompt, continue_final_message, template variables)."""
    if tokenizer is None or not (chat_template or getattr(tokenizer, "chat_template", None)):
        raise ValueError("this model has no tokenizer or chat template: pass a chat template (a Jinja template)")
    messages = [_text_message(m) for m in conversation]
    # tokenize=False gives the text in transformers 4 and 5 alike (tokenize=True: a BatchEncoding in 5)
    text = tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=False, **options)
    if not isinstance(text, str):
        raise ValueError(f"the chat template gave a {type(text).__name__}, not text")
    return text


def _text_message(message: Any) -> dict:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise TypeError(f"a message is a dict with a 'role' and a 'content', got {message!r:.80}")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise ValueError("message content parts must be text parts ({'type': 'text', 'text': ...})")
        content = "".join(p["text"] for p in content)
    return {**message, "content": content or ""}
