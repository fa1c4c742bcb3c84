"""`--chat-template` (serve and chat): a Jinja template given as a file or as the template text itself."""

from __future__ import annotations

import os


def read_chat_template(value: str | None) -> str | None:
    """`--chat-template`: a file's contents, or the value itself when it is a Jinja template."""
    if value is None or "{{" in value or "{%" in value:
        return value
    if not os.path.isfile(value):
        raise ValueError(f"--chat-template: no such file {value!r} (and not a Jinja template)")
    with open(value) as f:
        return f.read()
