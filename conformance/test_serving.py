"""OpenAI-server behaviour any server under `--engine openai:URL` should have (vLLM's does): bad integers and
unknown models are refused with a JSON error (or served) and the server goes on serving; a greedy stream gives
the same tokens and text as the whole response; a stop string ends the text where vLLM trims it.

Runs only with an `openai:` engine (an in-process engine has no HTTP surface); stdlib HTTP only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from .harness import Options

REFERENCE_FREE = True  # runs under --reference none

PROMPT = [9, 10, 11, 12, 13]  # token ids inside every golden vocabulary


@pytest.fixture(scope="module")
def server(options: Options) -> tuple[str, str]:
    if not options.engine.startswith("openai:"):
        pytest.skip("an HTTP-serving check: run with --engine openai:URL")
    base = options.engine.split(":", 1)[1].rstrip("/")
    with urllib.request.urlopen(f"{base}/models", timeout=30) as r:
        return base, json.load(r)["data"][0]["id"]


def _post(base: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(f"{base}/completions", data=json.dumps(body).encode(),
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
