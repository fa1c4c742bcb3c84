"""llama.cpp's OpenAI-compatible server of llama-cpp-python (``--engine llamacpp:URL``, URL the ``.../v1`` base).

    python -m llama_cpp.server --model M.gguf --model_alias CKPT --logits_all true --n_ctx 512 --port 8000
    pytest --pyargs conformance --engine llamacpp:http://127.0.0.1:8000/v1 --model CKPT --dtype float32 \\
        --engine-arg server_dtype=float32

Its ``/v1/completions`` differs from vLLM's (the ``openai:URL`` adapter) in three ways that matter here: ``prompt``
is text only (the ids are decoded with the checkpoint's tokenizer, and llama.cpp's own tokenization of that text
must give the ids back: the echoed prompt is checked), the logprobs are keyed by token *text* (mapped back to ids
with the checkpoint's tokenizer, oracle/served.py ``TokenTexts``; ambiguous texts dropped), and prompt logprobs
come only with ``echo: true``. EOS cannot be ignored (the goldens contain none). ``/v1/models`` says neither the
checkpoint nor the dtype: start the server with ``--model_alias CKPT`` and vouch for the dtype with
``--engine-arg server_dtype=float32``. The module's ``echo`` setting (``--engine-arg echo=false``) leaves prompt
logprobs out.
"""

from __future__ import annotations

from .compare import EngineOutput
from .openai_adapter import in_flight
from .served import ServedFacts, ServerMismatch, TokenTexts, check_served, http_json


class LlamaCppServerAdapter:
    """``llamacpp:URL`` (module docstring)."""

    name = "llamacpp-server"
    returns_logprobs = True

    def __init__(self, base_url: str, model_path: str, dtype: str, *, served_model: str = "", server_dtype: str = "",
                 echo: bool = True, timeout_s: float = 600.0) -> None:
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s
        card = http_json(f"{self.base_url}/models", timeout_s=30)["data"][0]
        check_served(ServedFacts(self.base_url, (card["id"],), None, {}, "/v1/models"), model_path, dtype,
                     served_model=served_model, server_dtype=server_dtype)
        self.model, self.echo = served_model or card["id"], echo
        self.returns_prompt_logprobs = echo
        self.texts = TokenTexts(model_path)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        return in_flight(lambda p: self._one(p, max_tokens, top_k, prompt_logprobs and self.echo), prompts)

    def _one(self, prompt: list[int], max_tokens: int, top_k: int, echo: bool) -> EngineOutput:
        payload = {"model": self.model, "prompt": self.texts.decode(prompt), "max_tokens": max_tokens,
                   "temperature": 0, "top_k": 1, "top_p": 1, "min_p": 0, "repeat_penalty": 1, "logprobs": top_k,
                   "echo": echo, "seed": 0}
        lp = http_json(f"{self.base_url}/completions", payload, self.timeout_s)["choices"][0]["logprobs"]
        ids = [self._id(t, i) for i, t in enumerate(lp["tokens"])]
        tops = [None if d is None else self._dict(d) for d in lp["top_logprobs"]]
        if not echo:
            return EngineOutput(ids, tops)
        if ids[:len(prompt)] != list(prompt):
            raise ServerMismatch(f"llama.cpp tokenized the prompt text to {ids[:len(prompt)][:12]}..., not the prompt "
                                 f"{list(prompt)[:12]}...: its tokenizer differs from the checkpoint's")
        return EngineOutput(ids[len(prompt):], tops[len(prompt):], [None] + tops[1:len(prompt)])

    def _id(self, text: str, i: int) -> int:
        tid = self.texts.to_id(text)
        if tid is None:
            raise ValueError(f"llama.cpp's token {i} is {text!r}, which no single id of the checkpoint's tokenizer "
                             "spells (ambiguous or unknown): the ids cannot be recovered")
        return tid

    def _dict(self, top: dict[str, float]) -> dict[int, float]:
        return {tid: float(v) for text, v in top.items() if (tid := self.texts.to_id(text)) is not None}

    def close(self) -> None:
        pass  # the server belongs to whoever started it
