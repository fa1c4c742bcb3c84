"""Stand-ins for real inference servers, for CI: a stdlib HTTP server on 127.0.0.1 that speaks one server's
documented protocol (vLLM's OpenAI route, trtllm-serve, TGI, SGLang's native /generate, Ollama; see the
adapters' docstrings for the sources) and computes with nanovllm_ref, so that each adapter is tested against
the wire format without the real server. ``Backend.perturb`` replaces one generated token of one prompt by a
token outside the top-k, to show that the suite names that prompt and position. What each server says about
itself (served name, dtype, config) is set per stand-in, to test the adapters' refusals.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from transformers.convert_slow_tokenizer import bytes_to_unicode

MAX_TOP = 20  # the stand-ins' top-n limits (TGI --max-top-n-tokens, Ollama's 0-20)


class Backend:
    """nanovllm_ref behind the stand-ins: greedy, memoized per request, with an optional perturbation."""

    def __init__(self, model_path: str, dtype: str = "float32") -> None:
        from nanovllm_ref import LLM

        self.model_path = model_path
        self.llm = LLM(model_path, dtype=dtype, device="cpu")
        self.tok = self.llm.tokenizer
        self.lock = threading.Lock()
        self.cache: dict[tuple, Any] = {}
        self.perturb: dict[tuple[int, ...], int] = {}  # prompt ids -> generated step to corrupt
        byte = {c: b for b, c in bytes_to_unicode().items()}
        self.raw = {tid: list(bytes(byte[c] for c in piece)) for piece, tid in self.tok.get_vocab().items()}

    def run(self, prompt: list[int], max_tokens: int, top_k: int, ignore_eos: bool = True) -> tuple:
        """(tokens, per-step {id: lp}, prompt logprobs, cached tokens, finish reason) for one greedy request."""
        from nanovllm_ref import SamplingParams

        key = (tuple(prompt), max_tokens, top_k, ignore_eos)
        with self.lock:
            if key not in self.cache:
                params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos,
                                        logprobs=top_k, prompt_logprobs=top_k)
                self.cache[key] = self.llm.generate([list(prompt)], params, use_tqdm=False)[0]
        out = self.cache[key]
        tokens, topk = list(out.token_ids), [dict(d) for d in out.logprobs]
        step = self.perturb.get(tuple(prompt))
        if step is not None and step < len(tokens):
            tokens[step] = next(t for t in range(3, len(self.raw)) if t not in topk[step])
            topk[step][tokens[step]] = -50.0
        return tokens, topk, out.prompt_logprobs, out.num_cached_tokens, out.finish_reason

    def text(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def close(self) -> None:
        self.llm.shutdown()


@dataclass
class Claims:
    """What a stand-in says about itself: served name, checkpoint path, dtype label, config, dev mode."""

    name: str
    root: str
    dtype: str | None = None  # as the server spells it ("torch.float32", "F32", "float32"); None: not said
    config: dict[str, Any] = field(default_factory=dict)
    dev_mode: bool = True  # vLLM: VLLM_SERVER_DEV_MODE=1 (/server_info)
    logprobs: bool = True  # Ollama: False = a server from before logprobs
    logprobs_mode: str = "raw_logprobs"  # vLLM's --logprobs-mode


def _openai_completion(b: Backend, body: dict, c: Claims, trtllm: bool) -> tuple[int, Any]:
    allowed = {"model", "prompt", "max_tokens", "temperature", "ignore_eos", "logprobs", "detokenize", "top_k"}
    if trtllm and set(body) - allowed:  # trtllm-serve's CompletionRequest: extra="forbid"
        return 400, {"object": "error", "message": f"Extra inputs are not permitted: {sorted(set(body) - allowed)}",
                     "type": "BadRequestError", "code": 400}
    prompt, k = body["prompt"], int(body.get("logprobs") or 0)
    tokens, topk, plp, cached, finish = b.run(prompt, body["max_tokens"], max(k, 1), body.get("ignore_eos", False))
    as_ids = body.get("return_tokens_as_token_ids", False)
    name = (lambda t: f"token_id:{t}") if as_ids else (lambda t: b.text([t]))
    logprobs = {"tokens": [name(t) for t in tokens], "token_logprobs": [d[t] for t, d in zip(tokens, topk)],
                "top_logprobs": [{name(t): v for t, v in d.items()} for d in topk], "text_offset": []}
    choice: dict[str, Any] = {"index": 0, "text": "" if trtllm else b.text(tokens), "logprobs": logprobs,
                              "finish_reason": finish}
    if trtllm and body.get("detokenize") is False:
        choice["token_ids"] = tokens
    if body.get("prompt_logprobs"):
        choice["prompt_logprobs"] = [None if d is None else {
            str(t): {"logprob": v, "rank": r + 1, "decoded_token": b.text([t])}
            for r, (t, v) in enumerate(d.items())} for d in plp]
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(tokens), "total_tokens": len(prompt) + len(tokens),
             "prompt_tokens_details": {"cached_tokens": cached}}
    return 200, {"id": "cmpl-0", "object": "text_completion", "model": c.name, "choices": [choice], "usage": usage}


def _tgi_generate(b: Backend, body: dict, c: Claims) -> tuple[int, Any]:
    p = body.get("parameters") or {}
    n = int(p.get("top_n_tokens") or 0)
    if n > MAX_TOP:
        return 422, {"error": f"`top_n_tokens` must be <= {MAX_TOP}. Given: {n}", "error_type": "validation"}
    ids = b.encode(body["inputs"])
    tokens, topk, plp, _, finish = b.run(ids, p["max_new_tokens"], max(n, 1), ignore_eos=False)  # no ignore_eos
    tok = lambda t, v: {"id": t, "text": b.text([t]), "logprob": v, "special": False}  # noqa: E731
    prefill = [{"id": ids[0], "text": b.text(ids[:1]), "logprob": None}]
    prefill += [{"id": t, "text": b.text([t]), "logprob": plp[i + 1][t]} for i, t in enumerate(ids[1:])]
    details = {"finish_reason": "length" if finish == "length" else "eos_token", "generated_tokens": len(tokens),
               "seed": None, "prefill": prefill if p.get("decoder_input_details") else [],
               "tokens": [tok(t, d[t]) for t, d in zip(tokens, topk)],
               "top_tokens": [[tok(t, v) for t, v in list(d.items())[:n]] for d in topk] if n else []}
    return 200, {"generated_text": b.text(tokens), "details": details if p.get("details") else None}


def _sglang_generate(b: Backend, body: dict, c: Claims) -> tuple[int, Any]:
    batch = body["input_ids"] and isinstance(body["input_ids"][0], list)
    sp, k = body.get("sampling_params") or {}, int(body.get("top_logprobs_num") or 0)
    triples = lambda d: [[v, t, None] for t, v in d.items()]  # noqa: E731
    results = []
    for ids in body["input_ids"] if batch else [body["input_ids"]]:
        tokens, topk, plp, cached, finish = b.run(ids, sp["max_new_tokens"], max(k, 1), sp.get("ignore_eos", False))
        meta = {"id": "0", "finish_reason": {"type": finish}, "prompt_tokens": len(ids),
                "completion_tokens": len(tokens), "cached_tokens": cached,
                "output_token_logprobs": [[d[t], t, None] for t, d in zip(tokens, topk)],
                "output_top_logprobs": [triples(dict(list(d.items())[:k])) for d in topk]}
        if body.get("logprob_start_len", -1) == 0:
            meta["input_token_logprobs"] = [[None if i == 0 else plp[i][t], t, None] for i, t in enumerate(ids)]
            meta["input_top_logprobs"] = [None] + [triples(dict(list(d.items())[:k])) for d in plp[1:]]
        results.append({"text": b.text(tokens), "output_ids": tokens, "meta_info": meta})
    return 200, results if batch else results[0]


def _ollama_generate(b: Backend, body: dict, c: Claims) -> tuple[int, Any]:
    if body.get("model") != c.name:
        return 404, {"error": f"model '{body.get('model')}' not found"}
    k = int(body.get("top_logprobs") or 0)
    if k > MAX_TOP:
        return 400, {"error": "top_logprobs must be between 0 and 20"}
    ids = b.encode(body["prompt"])
    tokens, topk, _, _, finish = b.run(ids, body["options"]["num_predict"], max(k, 1), ignore_eos=False)
    entry = lambda t, v: {"token": b.text([t]), "logprob": v, "bytes": b.raw[t]}  # noqa: E731
    reply = {"model": c.name, "response": b.text(tokens), "done": True, "done_reason": finish,
             "prompt_eval_count": len(ids), "eval_count": len(tokens)}
    if c.logprobs and body.get("logprobs"):
        reply["logprobs"] = [{**entry(t, d[t]), "top_logprobs": [entry(u, v) for u, v in list(d.items())[:k]]}
                             for t, d in zip(tokens, topk)]
    return 200, reply


def _ollama_show(c: Claims) -> dict:
    arch = "qwen3"
    keys = {"hidden_size": "embedding_length", "num_hidden_layers": "block_count",
            "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv"}
    info = {"general.architecture": arch, **{f"{arch}.{g}": c.config[k] for k, g in keys.items() if k in c.config}}
    return {"details": {"format": "gguf", "family": arch, "quantization_level": c.dtype}, "model_info": info}


ROUTES: dict[str, dict[tuple[str, str], Any]] = {
    "vllm": {
        ("GET", "/v1/models"): lambda b, q, c: (200, {"object": "list", "data": [
            {"id": c.name, "object": "model", "root": c.root, "max_model_len": 4096,
             # as nanovllm_ref's server reports itself (no dev-mode /server_info there)
             **({"dtype": c.dtype} if c.dtype and not c.dev_mode else {}),
             **({"config": c.config} if c.config else {})}]}),
        ("GET", "/server_info"): lambda b, q, c: (200, {"vllm_config": {"model_config": {
            "model": c.root, "dtype": c.dtype, "logprobs_mode": c.logprobs_mode}}}) if c.dev_mode else
        (404, {"detail": "Not Found"}),
        ("POST", "/v1/completions"): lambda b, q, c: _openai_completion(b, q, c, trtllm=False),
    },
    "trtllm": {
        ("GET", "/v1/models"): lambda b, q, c: (200, {"object": "list", "data": [{"id": c.name, "object": "model"}]}),
        ("POST", "/v1/completions"): lambda b, q, c: _openai_completion(b, q, c, trtllm=True),
    },
    "tgi": {
        ("GET", "/info"): lambda b, q, c: (200, {"model_id": c.name, "version": "stand-in",
                                                 **({"model_dtype": c.dtype} if c.dtype else {})}),
        ("POST", "/generate"): _tgi_generate,
    },
    "sglang": {
        ("GET", "/get_model_info"): lambda b, q, c: (200, {"model_path": c.root, "is_generation": True}),
        ("GET", "/get_server_info"): lambda b, q, c: (200, {"model_path": c.root, "dtype": c.dtype or "auto",
                                                            "served_model_name": c.name, "version": "stand-in"}),
        ("POST", "/generate"): _sglang_generate,
    },
    "ollama": {
        ("POST", "/api/show"): lambda b, q, c: (200, _ollama_show(c)) if q.get("model") == c.name else
        (404, {"error": f"model '{q.get('model')}' not found"}),
        ("POST", "/api/generate"): _ollama_generate,
    },
}


def serve(backend: Backend, flavor: str, claims: Claims) -> tuple[ThreadingHTTPServer, str]:
    """Start a stand-in on 127.0.0.1 (a free port) in a daemon thread; returns (server, base URL for the
    adapter). ``server.shutdown()`` stops it."""
    routes = ROUTES[flavor]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, method: str) -> None:
            route = routes.get((method, urlsplit(self.path).path))
            if route is None:
                status, payload = 404, {"detail": "Not Found"}
            else:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if method == "POST" else {}
                status, payload = route(backend, body, claims)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # the adapters keep up to 32 requests in flight (the default backlog is 5)
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    return server, base + "/v1" if flavor in ("vllm", "trtllm") else base
