"""OpenAI-server behaviour any server under `--engine openai:URL` should have (vLLM's does): bad integers and
unknown models are refused with a JSON error (or served) and the server goes on serving; a greedy stream gives
the same tokens and text as the whole response; a stop string ends the text where vLLM trims it; a streamed
completion or chat completion with logprobs equals the whole response (text, token ids, logprobs, top logprobs,
``text_offset`` numbered across chunks as in vLLM, finish_reason).

Runs with an `openai:` engine, and with the default `nanovllm_ref` engine against nanovllm_ref's own server
(conformance/local_server.py); other in-process engines have no HTTP surface. Stdlib HTTP only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from .harness import Options, selected_models
from .local_server import local_server

REFERENCE_FREE = True  # runs under --reference none

PROMPT = [9, 10, 11, 12, 13]  # token ids inside every golden vocabulary


@pytest.fixture(scope="module")
def server(options: Options, pytestconfig: pytest.Config) -> tuple[str, str]:
    if options.engine == "nanovllm_ref":
        model = next((m for m in selected_models(pytestconfig) if m.name == "qwen3-tiny"),
                     selected_models(pytestconfig)[0])
        with local_server(model.path, model.name, **dict(options.engine_args)) as base:
            yield base, model.name
        return
    if not options.engine.startswith("openai:"):
        pytest.skip("an HTTP-serving check: run with --engine openai:URL")
    base = options.engine.split(":", 1)[1].rstrip("/")
    with urllib.request.urlopen(f"{base}/models", timeout=30) as r:
        yield base, json.load(r)["data"][0]["id"]


def _post(base: str, body: dict, route: str = "completions") -> tuple[int, bytes]:
    req = urllib.request.Request(f"{base}/{route}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _greedy(model: str, **extra: object) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logprobs": 1, "return_tokens_as_token_ids": True, **extra}


def _served_normally(base: str, model: str) -> None:
    status, body = _post(base, _greedy(model))
    assert status == 200, body[:500]
    assert len(json.loads(body)["choices"][0]["logprobs"]["tokens"]) == 6


@pytest.mark.parametrize("field, value", [("seed", 2**64), ("seed", -(2**64)), ("top_k", 2**70),
                                          ("max_tokens", 2**70), ("logprobs", 2**40)])
def test_out_of_range_integers_are_refused_or_served_and_the_server_goes_on(server, field, value):
    base, model = server
    status, body = _post(base, {**_greedy(model), field: value})
    if status != 200:
        assert 400 <= status < 500, (status, body[:500])
        assert json.loads(body).get("error", {}).get("message") or json.loads(body).get("message"), body[:500]
    _served_normally(base, model)


def test_an_unknown_model_is_404(server):
    base, model = server
    status, _ = _post(base, {**_greedy(model), "model": model + "-no-such-model"})
    assert status == 404
    _served_normally(base, model)


def test_a_greedy_stream_equals_the_whole_response(server):
    base, model = server
    status, body = _post(base, _greedy(model))
    assert status == 200
    whole = json.loads(body)["choices"][0]
    status, body = _post(base, _greedy(model, stream=True))
    assert status == 200
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1] if json.loads(e).get("choices")]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [t for c in chunks if c.get("logprobs") for t in c["logprobs"]["tokens"]] == whole["logprobs"]["tokens"]
    assert chunks[-1]["finish_reason"] == whole["finish_reason"] == "length"


def test_a_stop_string_is_trimmed_from_the_text(server):
    base, model = server
    status, body = _post(base, _greedy(model, max_tokens=12))
    full = json.loads(body)["choices"][0]["text"]
    stop = next((full[i:i + 2] for i in range(1, len(full) - 1) if full[i:i + 2].strip()
                 and full.find(full[i:i + 2]) == i), None)
    if stop is None:
        pytest.skip(f"the greedy text {full!r} has no usable stop string")
    status, body = _post(base, _greedy(model, max_tokens=12, stop=[stop]))
    assert status == 200, body[:500]
    choice = json.loads(body)["choices"][0]
    assert choice["text"] == full[:full.index(stop)] and choice["finish_reason"] == "stop"


def _events(body: bytes) -> list[dict]:
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", body[-500:]
    return [json.loads(e)["choices"][0] for e in events[:-1] if json.loads(e).get("choices")]


def _same_logprobs(streamed: list[float | None], whole: list[float | None]) -> bool:
    """Logprob values of two runs of one greedy request (a prefix-cache hit may change their last bits)."""
    return len(streamed) == len(whole) and all(
        (a is None) == (b is None) and (a is None or abs(a - b) <= 1e-3) for a, b in zip(streamed, whole))


def _same_top(streamed: list[dict | None], whole: list[dict | None]) -> bool:
    return len(streamed) == len(whole) and all(
        (a is None) == (b is None) and (a is None or (a.keys() == b.keys() and _same_logprobs(
            [a[k] for k in a], [b[k] for k in a]))) for a, b in zip(streamed, whole))


def completion_stream_differences(whole: dict, chunks: list[dict]) -> list[str]:
    """How the chunks of a streamed /v1/completions choice, joined, differ from the whole response's choice: text,
    token ids (where the whole response reports them: vLLM sends ``token_ids: null`` unless the request asks for
    ``return_token_ids``), tokens, logprobs, top logprobs, text_offset and finish_reason."""
    joined = {key: [x for c in chunks if c.get("logprobs") for x in c["logprobs"][key]]
              for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    lps, wrong = whole["logprobs"], []
    if "".join(c["text"] for c in chunks) != whole["text"]:
        wrong.append(f"text {''.join(c['text'] for c in chunks)!r}, whole {whole['text']!r}")
    ids = [t for c in chunks for t in c.get("token_ids") or []]
    if whole.get("token_ids") is not None and ids != whole["token_ids"]:
        wrong.append(f"token_ids {ids}, whole {whole['token_ids']}")
    if joined["tokens"] != lps["tokens"]:
        wrong.append(f"tokens {joined['tokens']}, whole {lps['tokens']}")
    if not _same_logprobs(joined["token_logprobs"], lps["token_logprobs"]):
        wrong.append(f"token_logprobs {joined['token_logprobs']}, whole {lps['token_logprobs']}")
    if not _same_top(joined["top_logprobs"], lps["top_logprobs"]):
        wrong.append(f"top_logprobs {joined['top_logprobs']}, whole {lps['top_logprobs']}")
    # vLLM numbers a chunk's offsets from the text streamed before it, the whole response's from the token strings:
    # the two agree where the token strings spell the text (no token ends inside a character)
    if "".join(lps["tokens"]) == whole["text"] and "\ufffd" not in whole["text"]:
        if joined["text_offset"] != lps["text_offset"]:
            wrong.append(f"text_offset {joined['text_offset']}, whole {lps['text_offset']}")
    finish = [c["finish_reason"] for c in chunks if c.get("finish_reason")]
    if finish != [whole["finish_reason"]]:
        wrong.append(f"finish_reason of the chunks {finish}, whole {whole['finish_reason']!r}")
    return wrong


def test_a_streamed_completion_with_logprobs_equals_the_whole_response(server):
    """text, token ids, tokens, logprobs, top logprobs, text_offset (each chunk's numbered from the text sent
    before it, vLLM's initial_text_offset) and finish_reason of the chunks, joined, are the whole response's."""
    base, model = server
    body = {"model": model, "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    status, raw = _post(base, body)
    assert status == 200, raw[:500]
    whole = json.loads(raw)["choices"][0]
    status, raw = _post(base, {**body, "stream": True})
    assert status == 200, raw[:500]
    wrong = completion_stream_differences(whole, _events(raw))
    assert not wrong, "streamed /v1/completions differs from the whole response:\n  " + "\n  ".join(wrong)


def test_a_streamed_chat_completion_with_logprobs_equals_the_whole_response(server):
    base, model = server
    body = {"model": model, "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 10,
            "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    status, raw = _post(base, body, "chat/completions")
    if status == 400 and b"template" in raw:
        pytest.skip(f"the server has no chat template: {raw[:300]!r}")
    assert status == 200, raw[:500]
    whole = json.loads(raw)["choices"][0]
    status, raw = _post(base, {**body, "stream": True}, "chat/completions")
    assert status == 200, raw[:500]
    chunks = _events(raw)
    text = "".join(c.get("delta", {}).get("content") or "" for c in chunks)
    content = [x for c in chunks if c.get("logprobs") for x in c["logprobs"].get("content") or []]
    expected, wrong = whole["logprobs"]["content"], []
    if text != whole["message"]["content"]:
        wrong.append(f"content {text!r}, whole {whole['message']['content']!r}")
    if [e["token"] for e in content] != [e["token"] for e in expected]:
        wrong.append(f"tokens {[e['token'] for e in content]}, whole {[e['token'] for e in expected]}")
    elif not _same_logprobs([e["logprob"] for e in content], [e["logprob"] for e in expected]) or not _same_top(
            [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in content],
            [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in expected]):
        wrong.append(f"logprobs {content}, whole {expected}")
    finish = [c["finish_reason"] for c in chunks if c.get("finish_reason")]
    if finish != [whole["finish_reason"]]:
        wrong.append(f"finish_reason of the chunks {finish}, whole {whole['finish_reason']!r}")
    assert not wrong, "streamed /v1/chat/completions differs from the whole response:\n  " + "\n  ".join(wrong)
