"""An adapter for any OpenAI-compatible server (`--engine openai:http://127.0.0.1:8000/v1`).

Sends token-id prompts to `/v1/completions` with greedy settings, `logprobs=k`, vLLM's `ignore_eos` and
`return_tokens_as_token_ids` extensions (so top-k keys come back as "token_id:N"), and `prompt_logprobs`
when asked. Works against vLLM, SGLang (which accept the same extensions) and `nanovllm_ref.serve`.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from .compare import EngineOutput


def _token_id(key: str) -> int:
    if not key.startswith("token_id:"):
        raise ValueError(f"the server returned a logprob key {key!r}, not 'token_id:N': it must support "
                         f"return_tokens_as_token_ids")
    return int(key.split(":", 1)[1])


class OpenAIAdapter:
    name = "openai"

    def __init__(self, base_url: str, model: str = "", timeout_s: float = 600.0) -> None:
        self.base_url, self.model, self.timeout_s = base_url.rstrip("/"), model, timeout_s
        if not self.model:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=30) as r:
                self.model = json.load(r)["data"][0]["id"]

    def _post(self, payload: dict) -> dict:
        req = urllib.request.Request(f"{self.base_url}/completions", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.base_url}/completions answered HTTP {e.code}: {e.read()[:500]!r}") from None

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        outs = []
        for prompt in prompts:
            payload = {"model": self.model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0,
                       "logprobs": top_k, "ignore_eos": True, "return_tokens_as_token_ids": True}
            if prompt_logprobs:
                payload["prompt_logprobs"] = top_k
            choice = self._post(payload)["choices"][0]
            lp = choice["logprobs"]
            tokens = choice.get("token_ids") or [_token_id(t) for t in lp["tokens"]]
            topk = [{_token_id(k): v for k, v in step.items()} for step in lp["top_logprobs"]]
            plp = choice.get("prompt_logprobs")
            if plp is not None:
                plp = [None if d is None else {int(k.split(":")[-1]): _value(v) for k, v in d.items()} for d in plp]
            outs.append(EngineOutput(list(tokens), topk, plp, 0))
        return outs

    def run_requests(self, requests: list) -> list:
        """Requests with their own settings (oracle/requests.py), one /v1/completions call each: OpenAI's names
        and vLLM's extensions (top_k, min_p, repetition_penalty, min_tokens, stop_token_ids, ...) pass as they
        are; logit_bias keys become strings; token ids come back through logprobs ("token_id:N" keys, logprobs=0
        when none were asked). logprobs_mode is not an API field: anything but raw_logprobs is unsupported."""
        from .requests import Completion, UnsupportedSetting

        results = []
        for r in requests:
            params = dict(r.params)
            if params.pop("logprobs_mode", "raw_logprobs") != "raw_logprobs":
                raise UnsupportedSetting("the OpenAI API has no logprobs_mode: its logprobs are raw")
            if params.get("logit_bias"):
                params["logit_bias"] = {str(t): b for t, b in params["logit_bias"].items()}
            want_logprobs = params.get("logprobs") is not None
            payload = {"model": self.model, "prompt": list(r.prompt), "return_tokens_as_token_ids": True,
                       **params, "logprobs": params.get("logprobs") or 0}
            body = self._post(payload)
            completions = []
            for choice in sorted(body["choices"], key=lambda c: c.get("index", 0)):
                lp = choice["logprobs"]
                tokens = choice.get("token_ids") or [_token_id(t) for t in lp["tokens"]]
                steps = [{_token_id(k): v for k, v in (step or {}).items()} for step in lp.get("top_logprobs") or []]
                plp = choice.get("prompt_logprobs")
                if plp is not None:
                    plp = [None if d is None else {int(k.split(":")[-1]): _value(v) for k, v in d.items()}
                           for d in plp]
                completions.append(Completion(list(tokens), choice.get("finish_reason"),
                                              steps if want_logprobs else None, plp, None, choice.get("text")))
            results.append(completions)
        return results

    def close(self) -> None:
        pass


def _value(v: object) -> float:
    return float(v["logprob"]) if isinstance(v, dict) else float(v)  # vLLM nests {"logprob": x, ...}
