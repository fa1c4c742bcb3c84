"""Bad input to the server over raw HTTP (httpx): each gets its 4xx with an OpenAI-style JSON error naming the
parameter, and a normal request succeeds after it. Parameters the engine lacks are refused (400 naming them)
or honoured, by whatever `SamplingParams` has. Slow clients time out; a failing step fails only its requests;
a dead engine loop turns /health 503."""

from __future__ import annotations

import socket
import time

import pytest

httpx = pytest.importorskip("httpx")

from nanovllm_ref.serve.params import SAMPLING_FIELDS  # noqa: E402

from ..support.server import MODEL, running_server  # noqa: E402

NORMAL = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server():
    with running_server({"header_timeout_s": 2.0, "body_timeout_s": 2.0}) as running:
        yield running


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def assert_serves(http) -> None:
    r = http.post("/v1/completions", json=NORMAL)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["token_ids"]) == 3
    assert http.get("/health").status_code == 200


def assert_error(r, status: int, words: str, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"], error
    assert error["code"] == status
    if param is not None:
        assert error["param"] == param, error


BAD_COMPLETIONS = {
    "unknown parameter": ({"frobnicate": 1}, "frobnicate", "frobnicate"),
    "prompt of the wrong type": ({"prompt": 5}, "prompt", "prompt"),
    "no prompt": ({"prompt": None}, "prompt", "prompt"),
    "empty prompt": ({"prompt": ""}, "prompt", "prompt"),
    "empty token list": ({"prompt": []}, "prompt", "prompt"),
    "token outside the vocabulary": ({"prompt": [5, 10**9]}, "outside the vocabulary", "prompt"),
    "prompt over max_model_len": ({"prompt": [5] * 600}, "max_model_len", "prompt"),
    "max_tokens 0": ({"max_tokens": 0}, "max_tokens", "max_tokens"),
    "max_tokens 2**70": ({"max_tokens": 2**70}, "max_tokens", None),
    "negative temperature": ({"temperature": -1}, "temperature", "temperature"),
    "top_p 2": ({"top_p": 2}, "top_p", "top_p"),
    "logprobs 99": ({"logprobs": 99}, "logprobs", "logprobs"),
    "seed 2**64": ({"seed": 2**64}, "seed", "seed"),
    "seed -2**64": ({"seed": -(2**64)}, "seed", "seed"),
    "top_k 2**70": ({"top_k": 2**70}, "top_k", "top_k"),
    "top_k over the vocabulary": ({"top_k": 5000}, "vocabulary", "top_k"),
    "stop token outside the vocabulary": ({"stop_token_ids": [2**70]}, "stop_token_ids", "stop_token_ids"),
    "n 0": ({"n": 0}, "n must be", "n"),
    "n 10**6": ({"n": 10**6}, "n must be", "n"),
    "best_of": ({"best_of": 3}, "best_of", "best_of"),
    "suffix": ({"suffix": "x"}, "suffix", "suffix"),
    "stream_options without stream": ({"stream_options": {"include_usage": True}}, "stream_options",
                                      "stream_options"),
    "empty stop string": ({"stop": [""]}, "stop", "stop"),
    "logit_bias key not a token id": ({"logit_bias": {"abc": 1}}, "logit_bias", "logit_bias"),
    "prompt characters before tokenizing": ({"prompt": "x" * 600_000}, "characters", "prompt"),
}


@pytest.mark.parametrize("case", list(BAD_COMPLETIONS))
def test_bad_completion_requests_get_400(http, case):
    change, words, param = BAD_COMPLETIONS[case]
    start = time.perf_counter()
    assert_error(http.post("/v1/completions", json={**NORMAL, **change}), 400, words, param)
    assert time.perf_counter() - start < 5  # e.g. the long prompt is refused without tokenizing it
    assert_serves(http)


BAD_CHATS = {
    "no messages": ({"messages": []}, "messages"),
    "unknown role": ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    "image part": ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages"),
    "echo (completions only)": ({"echo": True}, "echo"),
    "tools": ({"tools": [{"type": "function"}]}, "tools"),
    "top_logprobs without logprobs": ({"top_logprobs": 2}, "top_logprobs"),
    "top_logprobs 50": ({"logprobs": True, "top_logprobs": 50}, "logprobs"),
    "continue_final_message with a generation prompt": ({"continue_final_message": True}, "continue_final_message"),
    "min_tokens over the rest of the context": ({"messages": [{"role": "user", "content": "hi " * 237}],  # 505 of
                                                 "max_tokens": None, "min_tokens": 10}, "min_tokens"),  # 512 tokens
}


@pytest.mark.parametrize("case", list(BAD_CHATS))
def test_bad_chat_requests_get_400(http, case):
    change, words = BAD_CHATS[case]
    assert_error(http.post("/v1/chat/completions", json={**CHAT, **change}), 400, words)
    assert_serves(http)


def test_json_methods_routes_models(http):
    assert_error(http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}),
                 400, "invalid JSON")
    assert_error(http.post("/v1/completions", json=[1, 2]), 400, "body")
    assert_error(http.get("/v1/completions"), 405, "GET is not allowed")
    assert_error(http.put("/v1/chat/completions", json=CHAT), 405, "PUT is not allowed")
    assert_error(http.delete("/v1/models"), 405, "DELETE")
    assert_error(http.post("/v1/nothing", json={}), 404, "no route")
    assert_error(http.post("/v1/completions", json={**NORMAL, "model": "gpt-4"}), 404, "does not exist", "model")
    assert_error(http.post("/v1/chat/completions", json={**CHAT, "model": "nope"}), 404, "does not exist", "model")
    assert http.get("/docs").status_code == 200
    assert "/v1/chat/completions" in http.get("/openapi.json").json()["paths"]
    assert_serves(http)


NON_NEUTRAL = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.3, "min_p": 0.2,
               "min_tokens": 2, "logit_bias": {"5": 5.0}}
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0, "repetition_penalty": 1.0, "min_p": 0, "min_tokens": 0,
           "logit_bias": {}}


@pytest.mark.parametrize("name", list(NON_NEUTRAL))
def test_engine_features_are_honoured_or_refused_never_ignored(http, name):
    r = http.post("/v1/completions", json={**NORMAL, name: NON_NEUTRAL[name]})
    if name in SAMPLING_FIELDS:  # the engine has it: served
        assert r.status_code == 200, r.text
    else:
        assert_error(r, 400, f"{name}: not supported by this engine", name)
    r = http.post("/v1/completions", json={**NORMAL, name: NEUTRAL[name]})  # neutral: honoured by any engine
    assert r.status_code == 200, r.text
    assert_serves(http)


def test_oversized_body_gets_413(http):
    big = {**NORMAL, "prompt": "x" * (2 << 20)}  # the test server's limit is 1 MiB
    assert_error(http.post("/v1/completions", json=big), 413, "over 1048576 bytes")
    assert_serves(http)


def _raw(server, data: bytes, wait_s: float) -> bytes:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_slow_clients_time_out(server, http):
    start = time.perf_counter()
    short_body = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: 1000\r\n\r\n{\"prompt\": ")
    reply = _raw(server, short_body, wait_s=8)  # the test server waits 2 s for the body
    assert reply.startswith(b"HTTP/1.1 408") and b"not received within 2 s" in reply, reply
    assert _raw(server, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n", wait_s=8).startswith(b"HTTP/1.1 408")
    assert time.perf_counter() - start < 12
    assert_serves(http)


def test_a_failing_step_fails_only_its_requests(server, http):
    runner = server.served.loop.llm.engine.runner

    def restore() -> None:
        runner.__dict__.pop("launch", None)  # the class's method again

    def broken(*args, **kwargs):  # the next step the runner launches
        restore()  # fail once
        raise RuntimeError("injected failure")

    runner.launch = broken
    try:
        r = http.post("/v1/completions", json={**NORMAL, "prompt": [8, 9, 10, 11]})
    finally:
        restore()
    assert_error(r, 500, "injected failure")
    assert server.served.loop.healthy
    assert_serves(http)


def test_health_is_503_when_the_engine_loop_dies():
    with running_server() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        llm = server.served.loop.llm

        def dead(*args, **kwargs):
            raise RuntimeError("engine bug")

        llm.step = dead
        assert_error(http.post("/v1/completions", json=NORMAL), 500, "engine bug")
        assert_error(http.get("/health"), 503, "engine bug")
        assert_error(http.post("/v1/completions", json=NORMAL), 503, "not running")
