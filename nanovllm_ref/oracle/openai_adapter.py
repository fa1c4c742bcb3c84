"""Adapters for OpenAI-compatible servers: ``--engine openai:URL`` (vLLM, SGLang, nanovllm_ref's server) and
``--engine trtllm:URL`` (TensorRT-LLM's ``trtllm-serve``), URL being the ``.../v1`` base.

``openai``: token-id prompts to ``/v1/completions`` with greedy settings, ``logprobs=k`` and vLLM's extensions
``ignore_eos``, ``return_tokens_as_token_ids`` (top-k keys come back as "token_id:N") and ``prompt_logprobs``;
all prompts are in flight at once, so the server batches them. Before any request the adapter checks what the
server runs (served.py): ``/v1/models`` (``id``, vLLM's ``root`` = the checkpoint path; nanovllm_ref's server
also ``dtype`` and ``config``) and, when vLLM runs with ``VLLM_SERVER_DEV_MODE=1``, ``/server_info`` (its
``model_config.dtype``; its ``logprobs_mode`` must be ``raw_logprobs``). ``num_cached_tokens`` is
``usage.prompt_tokens_details.cached_tokens`` when the server reports it (vLLM:
``--enable-prompt-tokens-details``), else None. Servers cap ``n`` per request (nanovllm_ref's and OpenAI's API at
64 and 128): a request-level call asking for more is split into requests of at most ``max_n_per_request``
samples (:data:`MAX_N_PER_REQUEST`, ``--engine-arg max_n_per_request=K``), the seed of each part moved on by the
samples before it, so sample i still draws with seed + i (vLLM's convention, which the suite checks). A request's
``structured_outputs`` (oracle/requests.py) goes as vLLM's extra body ``structured_outputs``; with
``structured_route="response_format"`` (``--engine-arg structured_route=response_format``) a JSON schema goes as
OpenAI's ``response_format`` (``{"type": "json_schema", "json_schema": {"name", "schema"}}``, ``json_object`` as
``{"type": "json_object"}``), the official route, and the other kinds, which it has no field for, as before.
Speculative decoding is a server's launch setting: ``--speculative-config JSON`` declares the one it runs (the
adapter's ``speculative_config``), its counts come from the server's ``/metrics`` (vLLM's ``vllm:spec_decode_*``
counters), and ``--engine-arg plain_url=URL`` names the checkpoint served without speculation, which an adapter
built without the config talks to (the speculative modules' baselines). The real server::

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model CKPT --dtype float32 \\
        --host 127.0.0.1 --port 8000 --enable-prompt-tokens-details
    pytest --pyargs conformance --engine openai:http://127.0.0.1:8000/v1 --model CKPT --dtype float32

``trtllm``: ``trtllm-serve CKPT --host 127.0.0.1 --port 8000 --backend pytorch`` (then ``--engine
trtllm:http://127.0.0.1:8000/v1 --engine-arg server_dtype=bfloat16``). Its CompletionRequest forbids unknown
fields, so only its own are sent: ``prompt`` (ids), ``temperature=0``, ``ignore_eos``, ``logprobs=k``
(the pytorch backend returns top-k), ``detokenize=false`` (so ``token_ids`` come back). Its top-logprob keys
are token *texts*, mapped back to ids with the checkpoint's tokenizer (ambiguous texts dropped from the
dict, which only weakens the absent-token check). It returns no prompt logprobs and does not say its dtype.
"""

from __future__ import annotations

import json
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from .compare import EngineOutput
from .requests import UNREPORTED
from .served import (
    ServedFacts,
    ServerMismatch,
    TokenTexts,
    check_served,
    http_json,
    http_sse,
    normalize_dtype,
    try_json,
)

MAX_IN_FLIGHT = 32
STRUCTURED_ROUTES = ("structured_outputs", "response_format")
MAX_N_PER_REQUEST = 64  # nanovllm_ref's server limit; OpenAI's API allows 128


def unreachable(url: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing accepts a TCP connection at ``url``'s host and port within ``timeout_s`` (None: something
    does). Checked once before a run, so that a server that is not up is one line, not one traceback per test."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:  # a port out of range or not a number
        return str(e)
    if not parts.hostname:
        return "the URL names no host"
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
    return None


def split_n(params: dict[str, Any], cap: int) -> list[dict[str, Any]]:
    """A request's settings as parts of at most ``cap`` samples each, in sample order: part j asks for the samples
    from ``start`` on, with ``seed + start`` (mod 2^64, kept in the signed range a server takes) when seeded."""
    n = int(params.get("n", 1))
    if n <= cap:
        return [params]
    parts = []
    for start in range(0, n, cap):
        part = {**params, "n": min(cap, n - start)}
        if params.get("seed") is not None:
            seed = (int(params["seed"]) + start) % 2**64
            part["seed"] = seed - 2**64 if seed >= 2**63 else seed  # int64, as servers parse it
        parts.append(part)
    return parts


def structured_body(params: dict[str, Any], route: str) -> dict[str, Any]:
    """``params`` with a ``structured_outputs`` dict sent by ``route`` (module docstring)."""
    spec = params.get("structured_outputs")
    if spec is None or route == "structured_outputs":
        return params
    rest = {k: v for k, v in params.items() if k != "structured_outputs"}
    if spec.get("json_object"):
        return {**rest, "response_format": {"type": "json_object"}}
    if spec.get("json") is not None:
        schema = json.loads(spec["json"]) if isinstance(spec["json"], str) else spec["json"]
        return {**rest, "response_format": {"type": "json_schema",
                                            "json_schema": {"name": "conformance", "schema": schema}}}
    return params  # regex, choice, grammar: no response_format for them


def _token_id(key: str) -> int:
    if not key.startswith("token_id:"):
        raise ValueError(f"the server returned a logprob key {key!r}, not 'token_id:N': it must support "
                         f"return_tokens_as_token_ids")
    return int(key.split(":", 1)[1])


def _value(v: object) -> float:
    return float(v["logprob"]) if isinstance(v, dict) else float(v)  # vLLM nests {"logprob": x, ...}


def cached_tokens(usage: dict | None) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` when the server reports it, else None (unknown)."""
    details = (usage or {}).get("prompt_tokens_details") or {}
    value = details.get("cached_tokens")
    return int(value) if value is not None else None


def vllm_server_facts(base_url: str) -> ServedFacts:
    """What an OpenAI-compatible server says it runs: ``/v1/models`` and, for vLLM in dev mode, ``/server_info``."""
    card = http_json(f"{base_url}/models", timeout_s=30)["data"][0]
    names = [card["id"], card.get("root") or ""]
    dtype, config, source = normalize_dtype(card.get("dtype")), dict(card.get("config") or {}), "/v1/models"
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(base_url))
    info = try_json(f"{origin}/server_info?config_format=json")
    model_config = ((info or {}).get("vllm_config") or {}).get("model_config") if isinstance(info, dict) else None
    if isinstance(model_config, dict):
        mode = model_config.get("logprobs_mode", "raw_logprobs")
        if mode != "raw_logprobs":  # the goldens are raw log-softmax values
            raise ServerMismatch(f"the server at {base_url} returns {mode}, not raw_logprobs: start vLLM without "
                                 "--logprobs-mode (or with --logprobs-mode raw_logprobs)")
        dtype = dtype or normalize_dtype(model_config.get("dtype"))
        names.append(str(model_config.get("model") or ""))
        source += ", /server_info"
    return ServedFacts(base_url, tuple(n for n in names if n), dtype, config, source)


class OpenAIAdapter:
    """``openai:URL`` (module docstring). ``served_model``: the name to request when the server serves the
    checkpoint under another name; ``server_dtype``: vouch for the dtype of a server that does not say it."""

    name = "openai"
    returns_logprobs = True
    returns_prompt_logprobs = True

    def __init__(self, base_url: str, model_path: str = "", dtype: str = "", *, served_model: str = "",
                 server_dtype: str = "", timeout_s: float = 600.0, max_n_per_request: int = MAX_N_PER_REQUEST,
                 structured_route: str = "structured_outputs", speculative_config: dict | None = None,
                 plain_url: str = "") -> None:
        # speculative_config: the config the server at base_url was started with (the suite's --speculative-config
        # declares it; a client cannot turn speculation on); plain_url: the same checkpoint served without it, which
        # an adapter built without speculative_config talks to (the speculative modules' baselines)
        if plain_url and speculative_config is None:
            base_url = plain_url
        self.speculative_config = speculative_config
        if not isinstance(max_n_per_request, int) or max_n_per_request < 1:
            raise ValueError(f"max_n_per_request must be an integer >= 1, got {max_n_per_request!r}")
        if structured_route not in STRUCTURED_ROUTES:
            raise ValueError(f"structured_route must be one of {STRUCTURED_ROUTES}, got {structured_route!r}")
        self.structured_route = structured_route
        self.base_url, self.timeout_s, self.max_n = base_url.rstrip("/"), timeout_s, max_n_per_request
        facts = self._facts()
        if model_path or dtype:  # load_adapter (--engine) always passes both; a bare client checks nothing
            check_served(facts, model_path, dtype, served_model=served_model, server_dtype=server_dtype)
        self.model = served_model or facts.names[0]
        self.model_path = model_path

    def _facts(self) -> ServedFacts:
        return vllm_server_facts(self.base_url)

    def spec_decode_stats(self) -> tuple[int, int, int] | None:
        """The server's ``vllm:spec_decode_*`` counters from its ``/metrics`` (vLLM's, nanovllm_ref's), None where it
        has none or was not declared speculative."""
        from .spec_decode import prometheus_spec_counts

        if self.speculative_config is None:
            return None
        origin = "{0.scheme}://{0.netloc}".format(urlsplit(self.base_url))
        try:
            with urllib.request.urlopen(f"{origin}/metrics", timeout=30) as r:
                return prometheus_spec_counts(r.read().decode())
        except (OSError, ValueError):
            return None

    def _payload(self, prompt: list[int], max_tokens: int, top_k: int, prompt_logprobs: bool) -> dict:
        payload = {"model": self.model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0,
                   "logprobs": top_k, "ignore_eos": True, "return_tokens_as_token_ids": True}
        if prompt_logprobs:
            payload["prompt_logprobs"] = top_k
        return payload

    def _post(self, payload: dict) -> dict:
        return http_json(f"{self.base_url}/completions", payload, self.timeout_s)

    def _one(self, prompt: list[int], max_tokens: int, top_k: int, prompt_logprobs: bool) -> EngineOutput:
        body = self._post(self._payload(prompt, max_tokens, top_k, prompt_logprobs))
        return self._convert(body["choices"][0], body.get("usage"))

    def _convert(self, choice: dict, usage: dict | None) -> EngineOutput:
        lp = choice["logprobs"]
        tokens = choice.get("token_ids") or [_token_id(t) for t in lp["tokens"]]
        topk = [{_token_id(k): v for k, v in step.items()} for step in lp["top_logprobs"]]
        plp = choice.get("prompt_logprobs")
        if plp is not None:
            plp = [None if d is None else {int(k.split(":")[-1]): _value(v) for k, v in d.items()} for d in plp]
        return EngineOutput(list(tokens), topk, plp, cached_tokens(usage))

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        """All prompts in flight at once (the server batches them), results in prompt order."""
        return in_flight(lambda p: self._one(p, max_tokens, top_k, prompt_logprobs), prompts)

    def run_requests(self, requests: list) -> list:
        """Requests with their own settings (oracle/requests.py), one /v1/completions call each: OpenAI's names
        and vLLM's extensions (top_k, min_p, repetition_penalty, min_tokens, stop_token_ids, ...) pass as they
        are; logit_bias keys become strings; token ids come back through logprobs ("token_id:N" keys, logprobs=0
        when none were asked). logprobs_mode is not an API field: anything but raw_logprobs is unsupported."""
        from .requests import Completion, UnsupportedSetting

        results = []
        for r in requests:
            params = structured_body(dict(r.params), self.structured_route)
            if params.pop("logprobs_mode", "raw_logprobs") != "raw_logprobs":
                raise UnsupportedSetting("the OpenAI API has no logprobs_mode: its logprobs are raw")
            if params.get("logit_bias"):
                params["logit_bias"] = {str(t): b for t, b in params["logit_bias"].items()}
            want_logprobs = params.get("logprobs") is not None
            payloads = [{"model": self.model, "prompt": list(r.prompt), "return_tokens_as_token_ids": True, **part,
                         "logprobs": part.get("logprobs") or 0}
                        for part in split_n(params, self.max_n)]  # a server caps n: more samples, more requests
            bodies = in_flight(self._post, payloads)
            choices = [c for body in bodies for c in sorted(body["choices"], key=lambda c: c.get("index", 0))]
            cached = cached_tokens(bodies[0].get("usage"))  # the first request's: later parts may hit its blocks
            completions = []
            for choice in choices:
                lp = choice["logprobs"]
                tokens = choice.get("token_ids") or [_token_id(t) for t in lp["tokens"]]
                steps = [{_token_id(k): v for k, v in (step or {}).items()} for step in lp.get("top_logprobs") or []]
                plp = choice.get("prompt_logprobs")
                if plp is not None:
                    plp = [None if d is None else {int(k.split(":")[-1]): _value(v) for k, v in d.items()}
                           for d in plp]
                completions.append(Completion(list(tokens), choice.get("finish_reason"),
                                              steps if want_logprobs else None, plp,
                                              cached, choice.get("text"),
                                              choice.get("stop_reason", UNREPORTED)))
            results.append(completions)
        return results

    def stream_requests(self, requests: list) -> list:
        """The requests as /v1/completions streams (``stream: true``, all in flight at once): each chunk's
        ``text`` is a piece of its choice, token ids from its logprobs ("token_id:N" keys), the choice's last
        chunk with a finish_reason gives it and ``stop_reason`` (vLLM's; UNREPORTED where a server sends none)."""
        return in_flight(self._stream_one, requests)

    def _stream_one(self, r: Any) -> list:
        from .requests import Completion, StreamedCompletion, UnsupportedSetting

        params = structured_body(dict(r.params), self.structured_route)
        if params.pop("logprobs_mode", "raw_logprobs") != "raw_logprobs":
            raise UnsupportedSetting("the OpenAI API has no logprobs_mode: its logprobs are raw")
        if params.get("logit_bias"):
            params["logit_bias"] = {str(t): b for t, b in params["logit_bias"].items()}
        payload = {"model": self.model, "prompt": list(r.prompt), "return_tokens_as_token_ids": True, **params,
                   "logprobs": params.get("logprobs") or 0, "stream": True}
        out = [StreamedCompletion(Completion([], "", text="")) for _ in range(params.get("n", 1))]
        for event in http_sse(f"{self.base_url}/completions", payload, self.timeout_s):
            for choice in event.get("choices") or []:
                s = out[choice.get("index", 0)]
                lp = choice.get("logprobs") or {}
                s.completion.token_ids += choice.get("token_ids") or [_token_id(t) for t in lp.get("tokens") or []]
                if choice.get("text"):
                    s.pieces.append(choice["text"])
                    s.completion.text += choice["text"]
                if choice.get("finish_reason") is not None:
                    s.completion.finish_reason = choice["finish_reason"]
                    s.completion.stop_reason = choice.get("stop_reason", UNREPORTED)
        return out

    def close(self) -> None:
        pass  # the server belongs to whoever started it


class TrtllmAdapter(OpenAIAdapter):
    """``trtllm:URL``: TensorRT-LLM's ``trtllm-serve`` through its OpenAI route (module docstring)."""

    name = "trtllm"
    returns_prompt_logprobs = False

    def __init__(self, base_url: str, model_path: str, dtype: str, **kwargs: Any) -> None:
        super().__init__(base_url, model_path, dtype, **kwargs)
        self.texts = TokenTexts(model_path)

    def _facts(self) -> ServedFacts:
        card = http_json(f"{self.base_url}/models", timeout_s=30)["data"][0]
        return ServedFacts(self.base_url, (card["id"],), None, {}, "/v1/models")

    def _payload(self, prompt: list[int], max_tokens: int, top_k: int, prompt_logprobs: bool) -> dict:
        return {"model": self.model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "logprobs": top_k, "detokenize": False}

    def _convert(self, choice: dict, usage: dict | None) -> EngineOutput:
        tokens = [int(t) for t in choice["token_ids"]]
        lp = choice["logprobs"]
        topk = []
        for tok, chosen, step in zip(tokens, lp["token_logprobs"], lp["top_logprobs"]):
            d = {tid: float(v) for text, v in step.items() if (tid := self.texts.to_id(text)) is not None}
            d[tok] = float(chosen)  # the sampled token's own logprob, by id
            topk.append(d)
        return EngineOutput(tokens, topk, None, cached_tokens(usage))


def in_flight(fn: Any, items: list) -> list:
    """``[fn(x) for x in items]`` with up to MAX_IN_FLIGHT calls at once, in order; the first error raises."""
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_IN_FLIGHT, len(items)))) as pool:
        return list(pool.map(fn, items))
