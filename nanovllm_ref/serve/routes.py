"""The OpenAI endpoints' logic: prompts from requests, and completion / chat responses and stream chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse

from ..chat_template import render_chat
from .engine_loop import EngineLoop
from .handlers import Choice, Generation, error_event, run_to_end, sse
from .params import BadRequest, plan_request
from .protocol import ChatCompletionRequest, CompletionRequest


@dataclass
class Served:
    """What the routes need: the engine loop, the server's own tokenizer (the engine thread has its own: fast
    tokenizers are not safe to share between threads), names, the chat template, the prompt limit and the metrics
    (None without prometheus-client). `aliases`: other names requests may use (the model as given on the
    command line, its folder), never listed."""

    loop: EngineLoop
    tokenizer: Any
    model_names: tuple[str, ...]
    chat_template: str | None
    max_prompt_chars: int
    metrics: Any = None
    aliases: tuple[str, ...] = ()

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names and name not in self.aliases:
            raise BadRequest(f"The model `{name}` does not exist.", "model", status=404)

    def check_chars(self, num_chars: int, param: str = "prompt") -> None:
        if num_chars > self.max_prompt_chars:  # checked before tokenizing: tokenizing 50 MB takes minutes
            raise BadRequest(f"{param}: {num_chars} characters cannot fit in max_model_len tokens "
                             f"(at most {self.max_prompt_chars} characters)", param)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.check_chars(len(text))
        if self.tokenizer is None:
            raise BadRequest("prompt: this checkpoint has no tokenizer; send token ids", "prompt")
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def token_str(self, token: int, as_ids: bool) -> str:
        return f"token_id:{token}" if as_ids or self.tokenizer is None else self.tokenizer.decode([token])


def _completion_prompts(served: Served, prompt: Any) -> tuple[list[str], list[list[int]]]:
    """(prompt texts, for echo; token ids) of a completion request's prompt(s)."""
    items = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else prompt
    if not items or any(len(p) == 0 for p in items):
        raise BadRequest("prompt: must not be empty", "prompt")
    ids = [served.encode(p) if isinstance(p, str) else list(p) for p in items]
    decode = served.tokenizer.decode if served.tokenizer is not None else lambda _: ""
    return [p if isinstance(p, str) else decode(i) for p, i in zip(items, ids)], ids


def _lp(value: float) -> float:
    return max(value, -9999.0)  # JSON has no -inf (vLLM clamps the same way)


def _completion_logprobs(served: Served, choice: Choice, as_ids: bool, echo: bool, start: int = 0,
                         offset: int = 0) -> dict | None:
    """OpenAI's completion logprobs for tokens [start:] of the choice (the prompt's first when echoing)."""
    lps = choice.finished_logprobs()
    if lps is None:
        return None
    tokens, steps = choice.token_ids[start:len(lps)], lps[start:]
    if echo and choice.prompt_logprobs is not None:
        tokens, steps = choice.prompt_ids + tokens, list(choice.prompt_logprobs) + steps
    strs = [served.token_str(t, as_ids) for t in tokens]
    offsets = [offset + sum(len(s) for s in strs[:i]) for i in range(len(strs))]
    return {"tokens": strs, "token_logprobs": [None if d is None else _lp(d[t]) for t, d in zip(tokens, steps)],
            "top_logprobs": [None if d is None else {served.token_str(k, as_ids): _lp(v) for k, v in d.items()}
                             for d in steps], "text_offset": offsets}


def _chat_logprobs(served: Served, choice: Choice, start: int, top: int, as_ids: bool) -> dict | None:
    lps = choice.finished_logprobs()
    if lps is None:
        return None

    def entry(token: int, logprob: float) -> dict:
        s = served.token_str(token, as_ids)  # (bytes of what `token` says, "token_id:N" too: vLLM's)
        return {"token": s, "logprob": _lp(logprob), "bytes": list(s.encode())}

    return {"content": [{**entry(t, d[t]), "top_logprobs": [entry(k, v) for k, v in
                                                           sorted(d.items(), key=lambda kv: -kv[1])[:top]]}
                        for t, d in zip(choice.token_ids[start:len(lps)], lps[start:])]}


async def completions(served: Served, req: CompletionRequest, receive: Any) -> Any:
    served.check_model(req.model)
    plan = plan_request(req)
    prompt_texts, prompts = _completion_prompts(served, req.prompt)
    gen = Generation(served.loop, served.tokenizer, plan, prompts)
    gen.start()
    model, as_ids = req.model or served.model_names[0], plan.tokens_as_ids
    if not req.stream:
        await run_to_end(gen, receive)
        gen.raise_if_failed()
        choices = [{"index": c.index, "text": (prompt_texts[c.index // plan.n] if plan.echo else "") + c.text,
                    "logprobs": _completion_logprobs(served, c, as_ids, plan.echo), "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason, "token_ids": c.token_ids,
                    **({"prompt_logprobs": _prompt_logprobs(c)} if c.prompt_logprobs is not None else {})}
                   for c in gen.choices]
        return {"id": gen.id, "object": "text_completion", "created": gen.created, "model": model,
                "choices": choices, "usage": gen.usage()}

    async def chunks() -> AsyncIterator[dict]:
        base = {"id": gen.id, "object": "text_completion", "created": gen.created, "model": model}
        echoed: set[int] = set()
        offsets: dict[int, int] = {}  # choice -> text_offset of its next token (the whole response's numbering)
        async for c, text in gen.events():
            if c.error is not None:
                yield error_event(c.error)
                return
            prefix = ""
            if plan.echo and c.index not in echoed:
                echoed.add(c.index)
                prefix = prompt_texts[c.index // plan.n]
            start, c.sent_tokens = c.sent_tokens, len(c.token_ids)
            lps = _completion_logprobs(served, c, as_ids, plan.echo and bool(prefix), start, offsets.get(c.index, 0))
            if lps is not None and lps["tokens"]:
                offsets[c.index] = lps["text_offset"][-1] + len(lps["tokens"][-1])
            out = {"index": c.index, "text": prefix + text, "logprobs": lps, "finish_reason": c.finish_reason,
                   "stop_reason": c.stop_reason, "token_ids": c.token_ids[start:]}
            yield {**base, "choices": [out], **({"usage": gen.usage()} if plan.usage_every_chunk else {})}
        if plan.usage_in_stream:
            yield {**base, "choices": [], "usage": gen.usage()}

    return StreamingResponse(sse(gen, chunks()), media_type="text/event-stream")


def _prompt_logprobs(c: Choice) -> list:
    return [None if d is None else {str(k): v for k, v in d.items()} for d in c.prompt_logprobs]


def _render_chat(served: Served, req: ChatCompletionRequest) -> str:
    template = served.chat_template or getattr(served.tokenizer, "chat_template", None)
    if served.tokenizer is None or not template:
        raise BadRequest("messages: this model has no chat template: start the server with --chat-template FILE, "
                         "or use /v1/completions", "messages")
    served.check_chars(sum(len(m.text()) for m in req.messages), "messages")
    messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in req.messages]
    try:
        return render_chat(served.tokenizer, messages, served.chat_template,
                           add_generation_prompt=req.add_generation_prompt,
                           continue_final_message=req.continue_final_message, **(req.chat_template_kwargs or {}))
    except Exception as e:  # jinja2 TemplateError, a bad chat_template_kwargs name, ...
        raise BadRequest(f"messages: the chat template failed: {type(e).__name__}: {e}", "messages") from None


async def chat_completions(served: Served, req: ChatCompletionRequest, receive: Any) -> Any:
    served.check_model(req.model)
    plan = plan_request(req)
    prompt = served.encode(_render_chat(served, req), add_special_tokens=False)  # the template has its own
    gen = Generation(served.loop, served.tokenizer, plan, [prompt])
    gen.id = "chat" + gen.id
    gen.start()
    model, top, as_ids = req.model or served.model_names[0], req.top_logprobs or 0, plan.tokens_as_ids
    if not req.stream:
        await run_to_end(gen, receive)
        gen.raise_if_failed()
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": _chat_logprobs(served, c, 0, top, as_ids), "finish_reason": c.finish_reason}
                   for c in gen.choices]
        return {"id": gen.id, "object": "chat.completion", "created": gen.created, "model": model,
                "choices": choices, "usage": gen.usage()}

    async def chunks() -> AsyncIterator[dict]:
        base = {"id": gen.id, "object": "chat.completion.chunk", "created": gen.created, "model": model}
        for c in gen.choices:
            yield {**base, "choices": [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]}
        async for c, text in gen.events():
            if c.error is not None:
                yield error_event(c.error)
                return
            start, c.sent_tokens = c.sent_tokens, len(c.token_ids)
            out = {"index": c.index, "delta": {"content": text} if text else {},
                   "logprobs": _chat_logprobs(served, c, start, top, as_ids), "finish_reason": c.finish_reason}
            yield {**base, "choices": [out], **({"usage": gen.usage()} if plan.usage_every_chunk else {})}
        if plan.usage_in_stream:
            yield {**base, "choices": [], "usage": gen.usage()}

    return StreamingResponse(sse(gen, chunks()), media_type="text/event-stream")
