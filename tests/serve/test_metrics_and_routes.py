"""The server's operator side: Prometheus `/metrics` scraped during a bounded load run (request and token
counters, load gauges and latency histograms move, by exactly what the run did), one access-log line per
request, `/docs` without any external script or style, and `/metrics` without prometheus-client."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("prometheus_client")  # the serve extra brings it

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from nanovllm_ref.serve.app import ACCESS_LOG  # noqa: E402

from ..support.server import MODEL, running_server  # noqa: E402

NUM_REQUESTS, MAX_TOKENS = 12, 48
PROMPTS = [[5 + i, 6, 7] + [9] * (3 * i) for i in range(NUM_REQUESTS)]  # 3..36 tokens, all different


@pytest.fixture(scope="module")
def server():
    with running_server() as running:
        yield running


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read().decode()


def scrape(url: str) -> dict[str, float]:
    """{'name{label=value,...}': value} of every sample but the `_created` timestamps."""
    status, kind, text = get(url + "/metrics")
    assert status == 200 and kind.startswith("text/plain"), (status, kind)
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith("_created"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
                assert s.labels.get("model_name") == MODEL, s
                samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def complete(url: str, prompt: list[int]) -> dict:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def test_metrics_scraped_during_a_load_run_move_by_what_the_run_did(server, caplog):
    caplog.set_level(logging.INFO, logger=ACCESS_LOG)
    before = scrape(server.url)
    results: list[dict] = []
    threads = [threading.Thread(target=lambda p=p: results.append(complete(server.url, p))) for p in PROMPTS]
    for t in threads:
        t.start()
    during = []
    while any(t.is_alive() for t in threads):
        during.append(scrape(server.url))
        time.sleep(0.01)
    for t in threads:
        t.join()
    after = scrape(server.url)
    assert len(results) == NUM_REQUESTS and all(r["usage"]["completion_tokens"] == MAX_TOKENS for r in results)

    def moved(name: str, at: dict = after) -> float:
        return at.get(name, 0.0) - before.get(name, 0.0)

    assert moved("vllm:request_success_total{finished_reason=length}") == NUM_REQUESTS
    assert moved("vllm:prompt_tokens_total{}") == sum(len(p) for p in PROMPTS)
    assert moved("vllm:generation_tokens_total{}") == NUM_REQUESTS * MAX_TOKENS
    for hist in ("time_to_first_token_seconds", "request_time_per_output_token_seconds",
                 "e2e_request_latency_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert moved(f"vllm:{hist}_count{{}}") == NUM_REQUESTS, hist
        assert moved(f"vllm:{hist}_sum{{}}") > 0, hist
        assert moved(f"vllm:{hist}_bucket{{le=+Inf}}") == NUM_REQUESTS, hist
    assert moved("vllm:request_generation_tokens_sum{}") == NUM_REQUESTS * MAX_TOKENS
    # while the run went on: requests in the batch, KV blocks in use, tokens counted as they came
    assert max(s["vllm:num_requests_running{}"] for s in during) >= 1
    assert max(s["vllm:kv_cache_usage_perc{}"] for s in during) > 0
    total = after["vllm:generation_tokens_total{}"]
    assert any(before.get("vllm:generation_tokens_total{}", 0) < s["vllm:generation_tokens_total{}"] < total
               for s in during), "no scrape saw the token counter between its start and end values"
    time.sleep(0.6)  # the idle engine loop refreshes the gauges within 0.5 s
    idle = scrape(server.url)
    assert idle["vllm:num_requests_running{}"] == 0 and idle["vllm:num_requests_waiting{}"] == 0
    # one access-log line per request, with its status
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOG]
    assert sum('"POST /v1/completions HTTP/1.1" 200 ' in line for line in lines) == NUM_REQUESTS
    assert sum('"GET /metrics HTTP/1.1" 200 ' in line for line in lines) == len(during) + 3  # + before, after, idle


def test_access_log_has_errors_and_unknown_routes_too(server, caplog):
    caplog.set_level(logging.INFO, logger=ACCESS_LOG)
    assert get(server.url + "/v1/nope?x=1")[0] == 404
    assert get(server.url + "/v1/models/gpt-4")[0] == 404
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOG]
    assert any(re.search(r'127\.0\.0\.1:\d+ "GET /v1/nope\?x=1 HTTP/1\.1" 404 \d+\.\d+s \d+B', line) for line in lines)
    assert any('"GET /v1/models/gpt-4 HTTP/1.1" 404' in line for line in lines)


def test_docs_are_one_page_without_external_scripts_or_styles(server):
    status, kind, page = get(server.url + "/docs")
    assert status == 200 and kind.startswith("text/html")
    assert "<script" not in page and not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    for route in ("/v1/completions", "/v1/chat/completions", "/v1/models/{model_id}", "/metrics", "/health"):
        assert f"<code>{route}</code>" in page, route
    assert "<code>max_tokens</code>" in page and "<code>messages</code>" in page  # request fields listed
    assert "<h4>ChatMessage</h4>" in page  # nested models expanded
    assert get(server.url + "/redoc")[0] == 404  # FastAPI's CDN pages are off
    assert get(server.url + "/openapi.json")[0] == 200


def test_metrics_without_prometheus_client_say_how_to_get_it(server, monkeypatch):
    monkeypatch.setattr(server.served, "metrics", None)
    status, _, body = get(server.url + "/metrics")
    assert status == 501 and "nanovllm_ref[serve]" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize("given, name", [("qwen3-tiny", "qwen3-tiny"), ("/models/Qwen3-0.6B/", "Qwen3-0.6B"),
                                         ("./ckpt", "ckpt"), (".", None)])
def test_the_default_served_name_is_never_a_path(given, name, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from nanovllm_ref.serve.server import default_model_name

    monkeypatch.chdir(tmp_path)
    assert default_model_name(SimpleNamespace(model_name=given)) == (name or tmp_path.name)


def test_requests_may_name_the_model_by_its_path_too(server):
    """(as a vLLM server started with a path: that path is an accepted name, never a listed one)"""
    path = str(server.served.loop.llm.config.model)
    body = json.dumps({"model": path, "prompt": [5, 6], "max_tokens": 2}).encode()
    req = urllib.request.Request(server.url + "/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.load(r)["usage"]["completion_tokens"] == 2
    assert path not in get(server.url + "/v1/models")[2]


def test_a_client_that_leaves_counts_as_an_aborted_request(server):
    import http.client

    name = "vllm:request_success_total{finished_reason=abort}"
    before = scrape(server.url).get(name, 0.0)
    conn = http.client.HTTPConnection(server.url.removeprefix("http://"), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": [5, 6], "max_tokens": 500,
                                                         "ignore_eos": True, "stream": True}),
                 {"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")
    conn.close()  # gone mid-stream
    deadline = time.monotonic() + 30
    while scrape(server.url).get(name, 0.0) == before:
        assert time.monotonic() < deadline, "the abandoned request was never counted"
        time.sleep(0.05)
    assert scrape(server.url)[name] == before + 1
