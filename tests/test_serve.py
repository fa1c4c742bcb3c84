"""The OpenAI-compatible server: completions with token-id prompts and logprobs agree with the offline engine
(through the `openai` adapter), streaming gives the same tokens, bad requests get HTTP 400 and the server
keeps serving."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from nanovllm_ref import LLM
from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.openai_adapter import OpenAIAdapter
from nanovllm_ref.serve import make_server

from .conftest import QWEN3, checkpoint_path

PROMPTS = [[5, 6, 7], [9] * 20 + [3, 4], list(range(3, 60))]


@pytest.fixture(scope="module")
def server():
    llm = LLM(str(checkpoint_path(QWEN3)), dtype="float32", max_model_len=512)
    srv = make_server(llm, "127.0.0.1", 0, model_name="tiny")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}/v1"
    srv.shutdown()
    srv.server_close()


def post(url: str, payload: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_openai_adapter_matches_offline_engine(server):
    remote = OpenAIAdapter(server).generate(PROMPTS, max_tokens=8, top_k=5, prompt_logprobs=True)
    local = NanovllmRefAdapter(str(checkpoint_path(QWEN3)), "float32", max_model_len=512).generate(
        PROMPTS, max_tokens=8, top_k=5, prompt_logprobs=True)
    for r, loc in zip(remote, local):
        assert r.token_ids == loc.token_ids
        for a, b in zip(r.topk, loc.topk):
            assert a.keys() == b.keys() and max(abs(a[k] - b[k]) for k in a) < 1e-5
        assert r.prompt_logprobs[0] is None and len(r.prompt_logprobs) == len(loc.prompt_logprobs)


def test_streaming_gives_the_same_tokens(server):
    payload = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    status, body = post(f"{server}/completions", payload)
    assert status == 200
    expected = json.loads(body)["choices"][0]["token_ids"]
    status, body = post(f"{server}/completions", {**payload, "stream": True})
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert [t for c in chunks for t in c["token_ids"]] == expected
    assert chunks[-1]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "payload, words",
    [
        ({"prompt": [], "max_tokens": 3}, "prompt"),
        ({"prompt": [5, 10**9], "max_tokens": 3}, "outside the vocabulary"),
        ({"prompt": [5], "max_tokens": 0}, "max_tokens"),
        ({"prompt": [5], "temperature": -1}, "temperature"),
        ({"prompt": [5], "logprobs": 99}, "logprobs"),
        ({"prompt": [5] * 600, "max_tokens": 3}, "max_model_len"),
    ],
)
def test_bad_requests_get_400_and_the_server_keeps_serving(server, payload, words):
    status, body = post(f"{server}/completions", payload)
    assert status == 400
    assert words in json.loads(body)["error"]["message"]
    status, body = post(f"{server}/completions", {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0})
    assert status == 200 and len(json.loads(body)["choices"][0]["token_ids"]) == 2


def test_invalid_json_and_unknown_route(server):
    req = urllib.request.Request(f"{server}/completions", data=b"{not json", headers={"Content-Type": "x"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    status, _ = post(f"{server}/nothing", {})
    assert status == 404


def _run_conformance(engine: str, tmp_path) -> tuple[int, str]:
    import os
    import subprocess
    import sys

    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pytest", "conformance/test_golden.py", "-q", "-p", "no:cacheprovider",
           "--engine", engine, "--model", QWEN3, "--dtype", "float32", "--report", str(report), "-k", "not gpu"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    return done.returncode, done.stdout + done.stderr


def test_conformance_suite_passes_through_the_openai_adapter(server, tmp_path):
    code, log = _run_conformance(f"openai:{server}", tmp_path)
    assert code == 0, log[-3000:]
    assert "passed" in log


@pytest.mark.parametrize("what", ["token", "logprob"])
def test_conformance_suite_fails_on_a_perturbed_engine_naming_prompt_and_position(tmp_path, what):
    from .perturbing_adapter import PROMPT, STEP

    code, log = _run_conformance(f"tests.perturbing_adapter:{what}_factory", tmp_path)
    assert code != 0, log[-3000:]
    from golden.load import load_golden

    prompt_name = load_golden(QWEN3, "float32").prompt_names[PROMPT]
    assert prompt_name in log and f"step {STEP}" in log, log[-3000:]
