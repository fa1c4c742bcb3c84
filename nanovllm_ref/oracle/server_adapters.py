"""Adapters for servers with their own protocols: Hugging Face TGI (``tgi:URL``), SGLang's native ``/generate``
(``sglang:URL``) and Ollama (``ollama:URL``). Each checks what the server runs before any request (served.py),
runs greedy decoding and returns :class:`EngineOutput`. The real servers and their protocols:

TGI (``text-generation-launcher --model-id CKPT --dtype bfloat16 --port 8080 --max-top-n-tokens 20``; the
router's ``GenerateRequest`` in ``router/src/lib.rs``): ``POST /generate`` ``{"inputs": TEXT, "parameters":
{"do_sample": false, "max_new_tokens", "details": true, "decoder_input_details": true, "top_n_tokens": k}}``
-> ``details.tokens`` (``id``, ``logprob``), ``details.top_tokens`` (per step, the top-n ``{id, logprob}``) and
``details.prefill`` (the prompt's tokens, ``logprob`` null for the first). TGI takes text only: the prompt ids
are decoded with the checkpoint's tokenizer and the prefill ids must come back equal (else the run stops
naming the prompt). ``GET /info`` gives ``model_id`` (and ``model_dtype`` in versions that have it). TGI
cannot ignore EOS: a server that stops early returns fewer tokens, judged by the policy at that step.

SGLang (``python -m sglang.launch_server --model-path CKPT --dtype float32 --port 30000``): ``POST /generate``
``{"input_ids": [[...], ...], "sampling_params": {"temperature": 0, "max_new_tokens", "ignore_eos": true},
"return_logprob": true, "top_logprobs_num": k, "logprob_start_len": 0}`` -> one result per prompt, converted
as the offline Engine's (external_adapters.py). ``GET /get_model_info`` (``model_path``) and ``GET
/get_server_info`` (its server args: ``dtype``, ``served_model_name``).

Ollama (``ollama create CKPT_NAME -f Modelfile`` with ``FROM /path/to/CKPT``, then ``ollama serve``; its API is
``api/types.go``): ``POST /api/generate`` ``{"model", "prompt": TEXT, "raw": true, "stream": false,
"options": {"temperature": 0, "num_predict"}, "logprobs": true, "top_logprobs": k <= 20}`` -> ``logprobs``:
per token ``{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}``; token texts/bytes are mapped
back to ids with the checkpoint's tokenizer. A server without logprobs (before 0.12) answers text only: the run
uses the policy's tokens-only mode, with the ids recovered along the reference (compare.ids_from_text), since
re-tokenizing the text would merge tokens differently. ``POST /api/show`` gives
``details.quantization_level`` (F32, BF16, F16: the dtype) and ``model_info`` (the architecture's sizes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .compare import EngineOutput
from .external_adapters import sglang_output_to_engine_output
from .openai_adapter import in_flight
from .served import ServedFacts, TokenTexts, check_served, http_json, normalize_dtype, try_json

# Ollama's model_info keys ("<architecture>.<key>", GGUF names) -> config.json keys
OLLAMA_CONFIG_KEYS = {"hidden_size": "embedding_length", "num_hidden_layers": "block_count",
                      "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
                      "intermediate_size": "feed_forward_length", "vocab_size": "vocab_size"}
OLLAMA_MAX_TOP_LOGPROBS = 20


class TGIAdapter:
    """``tgi:URL`` (module docstring). ``top_n_tokens``: ask for fewer than ``top_k`` when the server's
    ``--max-top-n-tokens`` is lower (TGI's default is 5)."""

    name = "tgi"
    returns_logprobs = True
    returns_prompt_logprobs = True  # the actual prompt token's logprob at each position (no top-n)

    def __init__(self, base_url: str, model_path: str, dtype: str, *, served_model: str = "", server_dtype: str = "",
                 top_n_tokens: int = 0, timeout_s: float = 600.0) -> None:
        self.base_url, self.timeout_s, self.top_n_tokens = base_url.rstrip("/"), timeout_s, top_n_tokens
        info = http_json(f"{self.base_url}/info", timeout_s=30)
        facts = ServedFacts(self.base_url, (info["model_id"],), normalize_dtype(info.get("model_dtype")), {}, "/info")
        check_served(facts, model_path, dtype, served_model=served_model, server_dtype=server_dtype)
        self.texts = TokenTexts(model_path)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        return in_flight(lambda ip: self._one(ip[0], ip[1], max_tokens, top_k), list(enumerate(prompts)))

    def _one(self, index: int, prompt: list[int], max_tokens: int, top_k: int) -> EngineOutput:
        params = {"do_sample": False, "max_new_tokens": max_tokens, "details": True, "decoder_input_details": True,
                  "top_n_tokens": self.top_n_tokens or top_k, "return_full_text": False}
        body = http_json(f"{self.base_url}/generate", {"inputs": self.texts.decode(prompt), "parameters": params},
                         self.timeout_s)
        details = body["details"]
        seen = [int(t["id"]) for t in details["prefill"]]
        if seen != list(prompt):
            raise ValueError(f"TGI tokenized prompt {index} as {seen[:12]}... ({len(seen)} tokens), not the "
                             f"{len(prompt)} ids sent {list(prompt)[:12]}...: the prompt does not survive TGI's "
                             "text round trip (or TGI added special tokens)")
        tokens = [int(t["id"]) for t in details["tokens"]]
        topk = []
        for chosen, step in zip(details["tokens"], details.get("top_tokens") or [[]] * len(tokens)):
            d = {int(t["id"]): float(t["logprob"]) for t in step}
            d[int(chosen["id"])] = float(chosen["logprob"])
            topk.append(d)
        plp: list[dict[int, float] | None] = [None]
        plp += [None if t["logprob"] is None else {int(t["id"]): float(t["logprob"])} for t in details["prefill"][1:]]
        return EngineOutput(tokens, topk, plp, None)

    def close(self) -> None:
        pass


class SGLangHTTPAdapter:
    """``sglang:URL``: SGLang's native ``/generate`` (module docstring); all prompts in one batched request."""

    name = "sglang-http"
    returns_logprobs = True
    returns_prompt_logprobs = True

    def __init__(self, base_url: str, model_path: str, dtype: str, *, served_model: str = "", server_dtype: str = "",
                 timeout_s: float = 600.0) -> None:
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s
        model_info = http_json(f"{self.base_url}/get_model_info", timeout_s=30)
        server = try_json(f"{self.base_url}/get_server_info") or {}
        names = (model_info["model_path"], str(server.get("served_model_name") or ""))
        facts = ServedFacts(self.base_url, tuple(n for n in names if n), normalize_dtype(server.get("dtype")), {},
                            "/get_model_info, /get_server_info")
        check_served(facts, model_path, dtype, served_model=served_model, server_dtype=server_dtype)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        payload = {"input_ids": [list(p) for p in prompts],
                   "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True},
                   "return_logprob": True, "top_logprobs_num": top_k,
                   "logprob_start_len": 0 if prompt_logprobs else -1, "return_text_in_logprobs": False}
        results = http_json(f"{self.base_url}/generate", payload, self.timeout_s)
        results = [results] if isinstance(results, dict) else results
        if len(results) != len(prompts):
            raise ValueError(f"SGLang answered {len(results)} results for {len(prompts)} prompts")
        return [sglang_output_to_engine_output(r, prompt_logprobs) for r in results]

    def close(self) -> None:
        pass


class OllamaAdapter:
    """``ollama:URL`` (module docstring). ``served_model``: the Ollama model name (default: the checkpoint
    folder's name). ``returns_logprobs`` is known after the first answer (False: tokens-only mode)."""

    name = "ollama"
    returns_prompt_logprobs = False

    def __init__(self, base_url: str, model_path: str, dtype: str, *, served_model: str = "", server_dtype: str = "",
                 timeout_s: float = 600.0) -> None:
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s
        self.model = served_model or Path(model_path.rstrip("/")).name
        self.returns_logprobs: bool | None = None
        show = http_json(f"{self.base_url}/api/show", {"model": self.model}, timeout_s=30)
        info, arch = show.get("model_info") or {}, (show.get("model_info") or {}).get("general.architecture", "")
        config = {k: info[f"{arch}.{g}"] for k, g in OLLAMA_CONFIG_KEYS.items() if f"{arch}.{g}" in info}
        dtype_served = normalize_dtype((show.get("details") or {}).get("quantization_level"))
        facts = ServedFacts(self.base_url, (self.model,), dtype_served, config, "/api/show")
        check_served(facts, model_path, dtype, served_model=served_model, server_dtype=server_dtype)
        self.texts = TokenTexts(model_path)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        outs = in_flight(lambda ip: self._one(ip[0], ip[1], max_tokens, top_k), list(enumerate(prompts)))
        self.returns_logprobs = all(has for _, has in outs)
        return [o for o, _ in outs]

    def _one(self, index: int, prompt: list[int], max_tokens: int, top_k: int) -> tuple[EngineOutput, bool]:
        payload = {"model": self.model, "prompt": self.texts.decode(prompt), "raw": True, "stream": False,
                   "options": {"temperature": 0, "num_predict": max_tokens}, "logprobs": True,
                   "top_logprobs": min(top_k, OLLAMA_MAX_TOP_LOGPROBS)}
        body = http_json(f"{self.base_url}/api/generate", payload, self.timeout_s)
        if int(body.get("prompt_eval_count") or 0) > len(prompt):
            raise ValueError(f"Ollama evaluated {body['prompt_eval_count']} prompt tokens for prompt {index} of "
                             f"{len(prompt)} ids: it added tokens (BOS?) or tokenized the text differently")
        if not body.get("logprobs"):  # a server without logprobs: text only (ids recovered by run_check)
            return EngineOutput([], [], None, None, body.get("response", "")), False
        tokens, topk = [], []
        for step, entry in enumerate(body["logprobs"]):
            tok = self._id(entry, index, step)
            d = {tid: float(t["logprob"]) for t in entry.get("top_logprobs") or []
                 if (tid := self.texts.to_id(t["token"], t.get("bytes"))) is not None}
            d[tok] = float(entry["logprob"])
            tokens.append(tok)
            topk.append(d)
        return EngineOutput(tokens, topk, None, None), True

    def decode(self, ids: list[int]) -> str:
        return self.texts.decode(ids)

    def _id(self, entry: dict[str, Any], index: int, step: int) -> int:
        tid = self.texts.to_id(entry["token"], entry.get("bytes"))
        if tid is None:
            raise ValueError(f"Ollama's token {entry['token']!r} (bytes {entry.get('bytes')}) at gen step {step} of "
                             f"prompt {index} is no single id of the checkpoint's tokenizer")
        return tid

    def close(self) -> None:
        pass
