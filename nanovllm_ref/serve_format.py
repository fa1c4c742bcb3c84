"""Request parsing and response shapes of the OpenAI-compatible server (completions and chat completions)."""

from __future__ import annotations

import json
import queue
import time
import uuid
from typing import Any

from .outputs import RequestOutput
from .serve import BadRequest, Handler, sampling_params_from

WAIT_S = 600.0  # a request that produces nothing for this long is aborted


def _token_str(handler: Handler, token: int, as_ids: bool) -> str:
    tok = handler.loop.llm.tokenizer
    return f"token_id:{token}" if as_ids or tok is None else tok.decode([token])


def _decode(handler: Handler, tokens: list[int]) -> str:
    tok = handler.loop.llm.tokenizer
    return tok.decode(tokens, skip_special_tokens=True) if tok is not None else ""


def _completion_logprobs(handler: Handler, out: RequestOutput, as_ids: bool) -> dict | None:
    if out.logprobs is None:
        return None
    return {
        "tokens": [_token_str(handler, t, as_ids) for t in out.token_ids],
        "token_logprobs": [lp[t] for t, lp in zip(out.token_ids, out.logprobs)],
        "top_logprobs": [{_token_str(handler, k, as_ids): v for k, v in lp.items()} for lp in out.logprobs],
        "text_offset": [],
    }


def _prompts(body: dict) -> list[str | list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return prompt
    raise BadRequest("prompt: a string, a list of token ids, or a list of either, non-empty")


def _wait(handler: Handler, rid: str, inbox: queue.Queue) -> RequestOutput:
    while True:
        try:
            kind, payload = inbox.get(timeout=WAIT_S)
        except queue.Empty:
            handler.loop.abort(rid)
            raise BadRequest(f"request {rid} timed out") from None
        if kind == "error":
            raise BadRequest(payload)
        if kind == "done":
            return payload


def handle_completions(handler: Handler, body: dict) -> None:
    params = sampling_params_from(body, chat=False)
    as_ids = bool(body.get("return_tokens_as_token_ids", False))
    # every prompt validated (and text tokenized, once) before any is queued
    prompts = [handler.loop.llm.engine.validate_request(p, params) for p in _prompts(body)]
    submitted = [handler.loop.submit(p, params) for p in prompts]
    created, cid = int(time.time()), f"cmpl-{uuid.uuid4().hex[:12]}"
    if body.get("stream"):
        return _stream(handler, submitted, cid, created, chat=False, as_ids=as_ids)
    outs = [_wait(handler, rid, inbox) for rid, inbox in submitted]
    choices = []
    for i, out in enumerate(outs):
        choice = {"index": i, "text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                  "logprobs": _completion_logprobs(handler, out, as_ids)}
        if out.prompt_logprobs is not None:
            choice["prompt_logprobs"] = [None if d is None else {str(k): v for k, v in d.items()}
                                         for d in out.prompt_logprobs]
        choices.append(choice)
    handler._json(200, {"id": cid, "object": "text_completion", "created": created, "model": handler.model_name,
                        "choices": choices, "usage": _usage(outs)})


def handle_chat(handler: Handler, body: dict) -> None:
    tok = handler.loop.llm.tokenizer
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: a non-empty list of {role, content} objects")
    if tok is None or getattr(tok, "chat_template", None) is None:
        raise BadRequest("this model has no chat template: use /v1/completions")
    params = sampling_params_from(body, chat=True)
    prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    rid, inbox = handler.loop.submit(prompt, params)
    created, cid = int(time.time()), f"chatcmpl-{uuid.uuid4().hex[:12]}"
    if body.get("stream"):
        return _stream(handler, [(rid, inbox)], cid, created, chat=True, as_ids=False)
    out = _wait(handler, rid, inbox)
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": out.text},
                              "finish_reason": out.finish_reason}
    if out.logprobs is not None:
        choice["logprobs"] = {"content": [
            {"token": _token_str(handler, t, False), "logprob": lp[t],
             "top_logprobs": [{"token": _token_str(handler, k, False), "logprob": v} for k, v in lp.items()]}
            for t, lp in zip(out.token_ids, out.logprobs)]}
    handler._json(200, {"id": cid, "object": "chat.completion", "created": created, "model": handler.model_name,
                        "choices": [choice], "usage": _usage([out])})


def _usage(outs: list[RequestOutput]) -> dict:
    p, c = sum(len(o.prompt_token_ids) for o in outs), sum(len(o.token_ids) for o in outs)
    cached = sum(o.num_cached_tokens or 0 for o in outs)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _stream(handler: Handler, submitted: list, cid: str, created: int, chat: bool, as_ids: bool) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Cache-Control", "no-cache")
    handler.end_headers()
    kind_name = "chat.completion.chunk" if chat else "text_completion"

    def send(index: int, tokens: list[int], finish: str | None) -> None:
        text = _decode(handler, tokens)
        delta = {"delta": {"content": text}} if chat else {"text": text, "token_ids": tokens}
        chunk = {"id": cid, "object": kind_name, "created": created, "model": handler.model_name,
                 "choices": [{"index": index, **delta, "finish_reason": finish}]}
        handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        handler.wfile.flush()

    for index, (rid, inbox) in enumerate(submitted):
        sent = 0
        while True:
            try:
                kind, payload = inbox.get(timeout=WAIT_S)
            except queue.Empty:
                handler.loop.abort(rid)
                break
            if kind == "error":
                handler.wfile.write(f"data: {json.dumps({'error': {'message': payload}})}\n\n".encode())
                break
            tokens = payload if kind == "delta" else payload.token_ids[sent:]
            if kind == "delta":
                sent += len(tokens)
                send(index, tokens, None)
            else:
                send(index, tokens, payload.finish_reason)
                break
    handler.wfile.write(b"data: [DONE]\n\n")
    handler.wfile.flush()
