"""A small OpenAI-compatible HTTP server over the engine: `python -m nanovllm_ref.serve MODEL`.

Endpoints: GET /health, GET /v1/models, POST /v1/completions and /v1/chat/completions (streaming with
server-sent events, `logprobs`, token-id prompts). vLLM's extensions are accepted where an oracle needs
them: `ignore_eos`, `top_k`, `seed`, `stop_token_ids`, `prompt_logprobs`, and `return_tokens_as_token_ids`
(logprob keys as "token_id:N", so token ids survive the JSON round trip). A bad request gets HTTP 400 with
an OpenAI-style JSON error, raised before the engine sees it; the server keeps serving.

One engine thread owns the engine (add, abort, step); HTTP handler threads talk to it through queues.
"""

from __future__ import annotations

import argparse
import itertools
import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .llm import LLM
from .outputs import RequestOutput
from .sampling_params import SamplingParams


class BadRequest(ValueError):
    pass


class EngineLoop(threading.Thread):
    """Runs the engine; delivers ("delta", new_token_ids) and ("done", RequestOutput) per request."""

    def __init__(self, llm: LLM) -> None:
        super().__init__(daemon=True, name="nanovllm_ref-engine")
        self.llm = llm
        self.commands: queue.Queue = queue.Queue()
        self.streams: dict[str, tuple[queue.Queue, int]] = {}
        self.lock = threading.Lock()  # validation reads engine state the engine thread also uses
        self._ids = itertools.count()

    def submit(self, prompt: str | list[int], params: SamplingParams) -> tuple[str, queue.Queue]:
        with self.lock:
            self.llm.engine.validate_request(prompt, params)  # raises before anything is queued
        rid, inbox = f"req-{next(self._ids)}", queue.Queue()
        self.commands.put(("add", rid, prompt, params, inbox))
        return rid, inbox

    def abort(self, rid: str) -> None:
        self.commands.put(("abort", rid))

    def run(self) -> None:
        while True:
            block = not self.llm.has_unfinished()
            try:
                while True:
                    self._apply(self.commands.get(block=block, timeout=0.5 if block else None))
                    block = False
            except queue.Empty:
                pass
            if not self.llm.has_unfinished():
                continue
            with self.lock:
                finished = self.llm.step()
            self._deliver(finished)

    def _apply(self, command: tuple) -> None:
        if command[0] == "add":
            _, rid, prompt, params, inbox = command
            try:
                with self.lock:
                    self.llm.add_request(prompt, params, request_id=rid)
                self.streams[rid] = (inbox, 0)
            except (ValueError, TypeError) as e:  # e.g. a request that stopped fitting meanwhile
                inbox.put(("error", str(e)))
        elif command[0] == "abort" and command[1] in self.streams:
            out = self.llm.abort_request(command[1])
            inbox, _ = self.streams.pop(command[1])
            if out is not None:
                inbox.put(("done", out))

    def _deliver(self, finished: list[RequestOutput]) -> None:
        live = self.llm.engine.requests
        for rid, (inbox, sent) in list(self.streams.items()):
            seq = live.get(rid)
            if seq is not None and seq.num_output_tokens > sent:
                inbox.put(("delta", seq.output_token_ids[sent:]))
                self.streams[rid] = (inbox, seq.num_output_tokens)
        for out in finished:
            inbox, _ = self.streams.pop(out.request_id, (None, 0))
            if inbox is not None:
                inbox.put(("done", out))


def sampling_params_from(body: dict, chat: bool) -> SamplingParams:
    known = {"temperature", "top_p", "top_k", "seed", "max_tokens", "max_completion_tokens", "ignore_eos",
             "stop_token_ids", "logprobs", "top_logprobs", "prompt_logprobs"}
    kwargs: dict[str, Any] = {k: body[k] for k in known & set(body) if body[k] is not None}
    if "max_completion_tokens" in kwargs:
        kwargs["max_tokens"] = kwargs.pop("max_completion_tokens")
    if chat:  # chat: logprobs is a bool, top_logprobs the count
        wanted = kwargs.pop("logprobs", False)
        top = kwargs.pop("top_logprobs", 0)
        kwargs["logprobs"] = top if wanted else None
    kwargs.pop("top_logprobs", None)
    if "n" in body and body["n"] not in (1, None):
        raise BadRequest("n: only n=1 is supported")
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as e:
        raise BadRequest(str(e)) from None


class Handler(BaseHTTPRequestHandler):
    loop: EngineLoop
    model_name: str

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet by default
        pass

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":  # root, dtype, config: what --engine openai:URL checks against --model/--dtype
            engine = self.loop.llm.engine
            arch = {k: v for k, v in engine.hf_config.to_dict().items() if isinstance(v, (int, float, str, bool))}
            self._json(200, {"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                         "root": engine.config.model, "dtype": str(engine.spec.dtype),
                                                         "config": arch}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        from .serve_format import handle_chat, handle_completions

        routes = {"/v1/completions": handle_completions, "/v1/chat/completions": handle_chat}
        if self.path not in routes:
            return self._error(404, f"no route {self.path}")
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            routes[self.path](self, body)
        except json.JSONDecodeError as e:
            self._error(400, f"invalid JSON: {e}")
        except (BadRequest, ValueError, TypeError) as e:
            self._error(400, str(e))


def make_server(llm: LLM, host: str = "127.0.0.1", port: int = 8000, model_name: str = "") -> ThreadingHTTPServer:
    loop = EngineLoop(llm)
    loop.start()
    handler = type("BoundHandler", (Handler,), {"loop": loop, "model_name": model_name or llm.config.model})
    server_cls = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 128})  # clients send batches at once
    server = server_cls((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default="")
    parser.add_argument("--config", default="{}", help='engine config as JSON, e.g. \'{"dtype": "float32"}\'')
    args = parser.parse_args(argv)
    llm = LLM(args.model, **json.loads(args.config))
    server = make_server(llm, args.host, args.port, args.served_model_name)
    print(f"nanovllm_ref serving {args.model} on http://{args.host}:{server.server_port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        llm.shutdown()


if __name__ == "__main__":
    main()
