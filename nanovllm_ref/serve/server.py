"""Run the server: the engine, its loop thread, the app, and uvicorn with timeouts for slow clients.

uvicorn's h11 protocol times out idle keep-alive connections but not a client that never finishes its request
headers; `_Protocol` closes such a connection (with a 408) after `header_timeout_s`. The body's own timeout and
size limit are the app's (app.BodyLimits), and so is the access log (app.AccessLog: one line per request on
stderr, `--no-access-log` to silence it; uvicorn's own access log stays off so that lines are not doubled).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..chat_template import read_chat_template
from ..llm import LLM
from ..loader import load_tokenizer
from .app import ACCESS_LOG, build_app
from .engine_loop import EngineLoop
from .routes import Served


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ()
    chat_template: str | None = None  # a file, or the template itself
    max_request_bytes: int = 4 << 20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    log_level: str = "warning"
    access_log: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(args.host, args.port, tuple(args.served_model_name), read_chat_template(args.chat_template),
                        args.max_request_bytes, args.header_timeout, args.body_timeout, args.log_level,
                        not args.no_access_log)


def max_prompt_chars(tokenizer: Any, max_model_len: int) -> int:
    """No token decodes to more characters than its vocabulary entry has (byte-level and SentencePiece alike),
    so a text longer than max_model_len times the longest entry cannot fit: refused without tokenizing."""
    if tokenizer is None:
        return 0
    return max_model_len * max(len(token) for token in tokenizer.get_vocab())


def default_model_name(llm: LLM) -> str:
    """The name a server without --served-model-name lists: the model as given when it is a bare name (a golden
    checkpoint's, a folder in the working folder), else the folder's name (no filesystem path goes out)."""
    given = llm.model_name.rstrip("/\\")
    bare = given not in ("", ".", "..") and os.path.basename(given) == given
    return given if bare else os.path.basename(os.path.abspath(given))


def _metrics(model_name: str) -> Any:
    try:
        from .metrics import ServerMetrics
    except ImportError:  # prometheus-client missing: /metrics says how to install it
        return None
    return ServerMetrics(model_name)


def make_served(llm: LLM, config: ServerConfig) -> Served:
    names = config.served_model_names or (default_model_name(llm),)
    metrics = _metrics(names[0])
    loop = EngineLoop(llm, metrics)
    loop.start()
    tokenizer = load_tokenizer(llm.config.model)  # the server's copy; the engine thread uses the engine's
    aliases = tuple({llm.model_name, str(llm.config.model)} - set(names))
    return Served(loop, tokenizer, names, read_chat_template(config.chat_template),
                  max_prompt_chars(tokenizer, llm.engine.spec.max_model_len), metrics, aliases)


class _Protocol(H11Protocol):
    header_timeout_s = 10.0

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.loop.call_later(self.header_timeout_s, self._headers_overdue)

    def _headers_overdue(self) -> None:
        if self.cycle is None and not self.transport.is_closing():  # still no complete request head
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()


def make_uvicorn(served: Served, config: ServerConfig) -> uvicorn.Server:
    protocol = type("HeaderTimeoutProtocol", (_Protocol,), {"header_timeout_s": config.header_timeout_s})
    app = build_app(served, config.max_request_bytes, config.body_timeout_s, config.access_log)
    return uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, http=protocol,
                                         log_level=config.log_level, timeout_keep_alive=5, lifespan="off",
                                         access_log=False))


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def serve(llm: LLM, config: ServerConfig, sock: socket.socket | None = None) -> None:
    """Serve until interrupted (on ``sock`` when the caller bound it already); then stop the engine loop and the
    engine."""
    served = make_served(llm, config)
    sock = sock if sock is not None else bind(config.host, config.port)
    if config.access_log:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger = logging.getLogger(ACCESS_LOG)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    print(f"nanovllm_ref serving {llm.config.model} as {served.model_names[0]!r} on "
          f"http://{config.host}:{sock.getsockname()[1]}/v1 (API docs: /docs, metrics: /metrics)", flush=True)
    try:
        make_uvicorn(served, config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shuts down gracefully on SIGINT, then re-raises it
        pass
    finally:
        served.loop.stop()
        llm.shutdown()
