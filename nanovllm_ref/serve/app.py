"""The FastAPI application: routes, OpenAI-style JSON errors, the request-body limits and the access log.

Routes: the OpenAI ones (/v1/completions, /v1/chat/completions, /v1/models, /v1/models/{id}), /health, /metrics
(Prometheus, metrics.py), /docs (an offline page, docs.py) and /openapi.json. A model card names the model and
its architecture (the config.json fields that identify it), never a filesystem path.

Every error is `{"error": {"message", "type", "param", "code"}}` with its HTTP status: 400 for a refused
parameter (pydantic's validation errors too, which FastAPI would answer with 422; vLLM answers 400), 404 for an
unknown model or route, 405 for a wrong method, 408 for a body not received in time, 413 for a body over
`max_request_bytes`, 500 when the engine failed a request, 501 from /metrics without prometheus-client, 503
from /health when the engine loop is dead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException

from .. import __version__
from .docs import docs_html
from .params import BadRequest
from .protocol import ChatCompletionRequest, CompletionRequest
from .routes import Served, chat_completions, completions

_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed", 408: "RequestTimeout",
          413: "RequestTooLarge", 500: "InternalServerError", 501: "NotImplemented", 503: "ServiceUnavailable"}
ACCESS_LOG = "nanovllm_ref.serve.access"
# config.json fields that identify an architecture (what `--engine openai:URL` compares with --model)
ARCH_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size", "tie_word_embeddings",
               "max_position_embeddings", "num_experts", "num_experts_per_tok")


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "Error"), "param": param, "code": status}}


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """'name: what is wrong' for each offending parameter (one line per parameter, not per union member)."""
    seen: dict[str, str] = {}
    for e in errors:
        loc = [str(x) for x in e.get("loc", ())[1:]]  # ("body", name, ...)
        name = loc[0] if loc else "body"
        msg = "unknown parameter (refused, not ignored)" if e.get("type") == "extra_forbidden" else e.get("msg")
        if e.get("type") == "json_invalid":
            name, msg = "body", f"invalid JSON: {e.get('ctx', {}).get('error', msg)}"
        seen.setdefault(name, f"{'.'.join(loc) or name}: {msg}")
    return "; ".join(seen.values()), next(iter(seen), None)


class BodyLimits:
    """ASGI middleware: read the whole body first, within `max_bytes` (413) and `timeout_s` per read (408), so
    no handler ever waits on a client that sends less than its Content-Length."""

    def __init__(self, app: Any, max_bytes: int, timeout_s: float) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        too_large = not length.isdigit() or int(length) > self.max_bytes
        body, more = b"", True
        while more:  # an oversized body is read to its end (and dropped) so the client can read the 413
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except asyncio.TimeoutError:
                return await self._error(send, 408, f"request body not received within {self.timeout_s:g} s")
            if message["type"] == "http.disconnect":
                return
            more = message.get("more_body", False)
            if not too_large:
                body += message.get("body", b"")
                too_large = len(body) > self.max_bytes
        if too_large:
            return await self._error(send, 413, f"request body over {self.max_bytes} bytes (--max-request-bytes)")
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _error(send: Any, status: int, message: str) -> None:
        data = json.dumps(error_body(status, message)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})


class AccessLog:
    """ASGI middleware: one log line per HTTP request as its response ends (written before the last body part
    goes out, so a client that has its response finds the line; a stream: when it ends or the client leaves):
    client, request line, status ("-": none was sent), seconds, response bytes."""

    def __init__(self, app: Any) -> None:
        self.app, self.log = app, logging.getLogger(ACCESS_LOG)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status, size, logged = time.perf_counter(), "-", 0, False

        def line() -> None:
            nonlocal logged
            logged = True
            host, port = scope.get("client") or ("-", 0)
            query = scope.get("query_string", b"").decode("latin-1")
            target = scope["path"] + (f"?{query}" if query else "")
            self.log.info('%s:%s "%s %s HTTP/%s" %s %.3fs %dB', host, port, scope["method"], target,
                          scope.get("http_version", "1.1"), status, time.perf_counter() - start, size)

        async def record(message: dict) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = str(message["status"])
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
                if not message.get("more_body", False):
                    line()
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            if not logged:
                line()


def model_card(served: Served, created: int) -> dict:
    """What /v1/models says of every served name (besides its id): the checkpoint's folder name as vLLM's `root`,
    the length and dtype it runs with, and the architecture fields of its config."""
    engine = served.loop.llm.engine
    config = engine.hf_config.to_dict()
    return {"object": "model", "created": created, "owned_by": "nanovllm_ref",
            "root": os.path.basename(os.path.normpath(engine.config.model)), "parent": None,
            "max_model_len": engine.spec.max_model_len, "dtype": str(engine.spec.dtype).removeprefix("torch."),
            "config": {k: config[k] for k in ARCH_FIELDS if isinstance(config.get(k), (int, float, str, bool))}}


def build_app(served: Served, max_request_bytes: int = 4 << 20, body_timeout_s: float = 30.0,
              access_log: bool = True) -> Any:
    """The ASGI app: FastAPI inside the body-limit middleware, inside the access log (when on)."""
    app = FastAPI(title="nanovllm_ref", summary="OpenAI-compatible server over the nanovllm_ref engine",
                  version=__version__, docs_url=None, redoc_url=None)  # their pages load scripts from a CDN
    app.state.served = served
    created = int(time.time())

    @app.exception_handler(BadRequest)
    async def _bad_request(request: Request, e: BadRequest) -> JSONResponse:
        return JSONResponse(error_body(e.status, str(e), e.param), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(list(e.errors()))
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException) -> JSONResponse:
        message = f"{request.method} is not allowed on {request.url.path}" if e.status_code == 405 else (
            f"no route {request.url.path}" if e.status_code == 404 else str(e.detail))
        return JSONResponse(error_body(e.status_code, message), status_code=e.status_code, headers=e.headers)

    @app.get("/health", summary="200 while the engine loop runs, 503 once it has died")
    async def health() -> JSONResponse:
        if served.loop.healthy:
            return JSONResponse({"status": "ok"})
        return JSONResponse(error_body(503, f"the engine loop is dead: {served.loop.fatal}"), status_code=503)

    card = model_card(served, created)

    @app.get("/v1/models", summary="the served model names (root: the checkpoint's name; dtype; architecture)")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, **card} for name in served.model_names]}

    @app.get("/v1/models/{model_id:path}", summary="one served model (404 for a name not served)")
    async def model(model_id: str) -> dict:
        if model_id not in served.model_names:
            raise BadRequest(f"The model `{model_id}` does not exist.", "model", status=404)
        return {"id": model_id, **card}

    @app.get("/metrics", summary="Prometheus metrics (vLLM's names: requests, tokens, load, latencies)")
    async def metrics() -> Response:
        if served.metrics is None:
            return JSONResponse(error_body(501, "metrics need prometheus-client: pip install 'nanovllm_ref[serve]'"),
                                status_code=501)
        return Response(served.metrics.render(), media_type=served.metrics.content_type)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(docs_html(app.openapi()))

    @app.post("/v1/completions", summary="OpenAI completions (vLLM's extensions included)")
    async def _completions(req: CompletionRequest, request: Request) -> Any:
        return await completions(served, req, request.receive)

    @app.post("/v1/chat/completions", summary="OpenAI chat completions (vLLM's extensions included)")
    async def _chat(req: ChatCompletionRequest, request: Request) -> Any:
        return await chat_completions(served, req, request.receive)

    limited = BodyLimits(app, max_request_bytes, body_timeout_s)
    return AccessLog(limited) if access_log else limited
