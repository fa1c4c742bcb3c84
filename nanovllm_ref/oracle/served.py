"""What the HTTP adapters share: JSON over HTTP, the check that a server runs the checkpoint and dtype under test,
and the map from token texts back to token ids (for servers that answer with texts).

A conformance run against a server is only meaningful for the checkpoint and dtype the server really runs, so
every HTTP adapter gathers what its server says about itself into :class:`ServedFacts` (its served names, its
dtype, its model config where it exposes them) and :func:`check_served` refuses a mismatch with
:class:`ServerMismatch`, naming both sides. A server that does not say which dtype it runs must be vouched for
(``--engine-arg server_dtype=bfloat16``); a server serving the checkpoint under another name is named with
``--engine-arg served_model=NAME`` (its config is still compared where the server exposes one).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# config.json keys that identify an architecture; compared wherever a server exposes its model config
ARCH_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "head_dim", "intermediate_size", "tie_word_embeddings")
_DTYPE_ALIASES = {"float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
                  "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                  "f16": "float16", "half": "float16"}


class ServerMismatch(RuntimeError):
    """The server runs another model or dtype than the run asks for (the message names both)."""


def http_json(url: str, payload: Any = None, timeout_s: float = 600.0, retries: int = 3) -> Any:
    """GET (``payload`` None) or POST JSON; an HTTP error raises RuntimeError with the server's message. A reset
    connection (a server whose accept backlog overflowed) is retried: the adapters' requests are idempotent."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    for attempt in range(retries + 1):
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{url} answered HTTP {e.code}: {e.read()[:800].decode(errors='replace')}") from None
        except (ConnectionResetError, http.client.RemoteDisconnected, urllib.error.URLError) as e:
            reset = not isinstance(e, urllib.error.URLError) or isinstance(e.reason, ConnectionResetError)
            if attempt == retries or not reset:
                raise
            time.sleep(0.2 * (attempt + 1))


def http_sse(url: str, payload: Any, timeout_s: float = 600.0) -> list[Any]:
    """POST JSON to a server-sent-events route; the ``data:`` objects in order, up to ``[DONE]``."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    events = []
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                events.append(json.loads(data))
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url} answered HTTP {e.code}: {e.read()[:800].decode(errors='replace')}") from None
    return events


def try_json(url: str, payload: Any = None, timeout_s: float = 30.0) -> Any | None:
    """:func:`http_json`, or None when the server has no such route (HTTP 404/405)."""
    try:
        return http_json(url, payload, timeout_s)
    except RuntimeError as e:
        if " answered HTTP 404" in str(e) or " answered HTTP 405" in str(e):
            return None
        raise


def normalize_dtype(value: Any) -> str | None:
    """``"torch.bfloat16"``, ``"BF16"``, ``"bf16"`` -> ``"bfloat16"``; None for unknown / ``"auto"``."""
    if not isinstance(value, str):
        return None
    return _DTYPE_ALIASES.get(value.strip().lower().removeprefix("torch."))


@dataclass(frozen=True)
class ServedFacts:
    """What a server says it runs. ``names``: served model names and paths; ``dtype``: normalized, or None
    when the server does not say; ``config``: config.json-like fields, where exposed; ``source``: the routes."""

    url: str
    names: tuple[str, ...]
    dtype: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def _same_checkpoint(name: str, model_path: str) -> bool:
    name = name.strip().rstrip("/")
    if not name:
        return False
    if os.path.isdir(name) and os.path.isdir(model_path):
        return os.path.samefile(name, model_path)
    base = Path(name).name.split(":")[0]  # an Ollama tag ("qwen3-tiny:latest") names the same model
    return base == Path(model_path.rstrip("/")).name


def local_config(model_path: str) -> dict[str, Any]:
    path = Path(model_path) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def check_served(facts: ServedFacts, model_path: str, dtype: str, *, served_model: str = "",
                 server_dtype: str = "") -> None:
    """Raise :class:`ServerMismatch` unless the server runs ``model_path`` in ``dtype`` (see the module doc)."""
    where = f"the server at {facts.url} ({facts.source})"
    if not served_model and not any(_same_checkpoint(n, model_path) for n in facts.names):
        raise ServerMismatch(f"{where} serves {list(facts.names)}, not --model {model_path!r}: serve that "
                             "checkpoint, or name it with --engine-arg served_model=NAME")
    ours = local_config(model_path)
    for key in ARCH_KEYS:
        if key in facts.config and key in ours and facts.config[key] != ours[key]:
            raise ServerMismatch(f"{where} runs a model with {key}={facts.config[key]!r}, but --model "
                                 f"{model_path!r} has {key}={ours[key]!r}")
    declared = normalize_dtype(server_dtype) if server_dtype else None
    if server_dtype and declared is None:
        raise ValueError(f"--engine-arg server_dtype={server_dtype!r}: use float32, bfloat16 or float16")
    served = facts.dtype or declared
    if served is None:
        raise ServerMismatch(f"{where} does not say which dtype it runs, so --dtype {dtype} cannot be checked: "
                             f"declare it with --engine-arg server_dtype={dtype} if the server was started so")
    if served != dtype:
        raise ServerMismatch(f"{where} runs {served}, but --dtype is {dtype}: the comparison would use the "
                             f"{dtype} goldens for a {served} engine")
    if declared is not None and declared != served:
        raise ServerMismatch(f"{where} runs {served}, but --engine-arg server_dtype says {declared}")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character table, by which byte-level BPE vocabularies spell raw bytes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class TokenTexts:
    """Token id <-> text and raw bytes of a checkpoint's tokenizer, for servers that answer with token texts
    (Ollama, trtllm-serve's top logprobs). A text several ids share maps to None (ambiguous), never a guess."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        vocab = self.tokenizer.get_vocab()  # {piece: id}
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        byte_level = all(ch in byte_of for piece in list(vocab)[:200] for ch in piece)
        self.by_text: dict[str, list[int]] = {}
        self.by_bytes: dict[bytes, list[int]] = {}
        for piece, tid in vocab.items():
            text = self.tokenizer.decode([tid])
            self.by_text.setdefault(text, []).append(tid)
            raw = bytes(byte_of[c] for c in piece) if byte_level and all(c in byte_of for c in piece) \
                else text.encode()
            self.by_bytes.setdefault(raw, []).append(tid)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def to_id(self, text: str, raw: list[int] | None = None) -> int | None:
        """The id of a token given as text (and raw bytes when the server sends them); None if ambiguous."""
        ids = self.by_bytes.get(bytes(raw), []) if raw else self.by_text.get(text, [])
        return ids[0] if len(ids) == 1 else None
