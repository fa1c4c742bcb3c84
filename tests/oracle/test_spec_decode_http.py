"""The speculative modules over HTTP: ``--engine openai:URL --speculative-config JSON`` declares the config a server
was started with, its ``/metrics`` counters show the drafts, and ``--engine-arg plain_url=URL`` names the same
checkpoint served without speculation for the cases that compare with it. nanovllm_ref's own server on both sides;
a plain server declared speculative fails (no drafts), so the declaration is checked, not trusted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from conformance.local_server import local_server
from golden.load import checkpoint_path
from nanovllm_ref.oracle.spec_decode import NGRAM, prometheus_spec_counts

ROOT = Path(__file__).resolve().parents[2]
MODEL = checkpoint_path("qwen3-tiny")
SPEC = {**NGRAM, "num_speculative_tokens": 3}


def _suite(spec_url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "conformance/test_spec_decode.py",
         "--engine", f"openai:{spec_url}", "--speculative-config", json.dumps(SPEC), "--model", "qwen3-tiny",
         "--dtype", "float32", "--report", "/dev/null", *extra],
        capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_prometheus_spec_counts() -> None:
    text = ('# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total{engine="0"} 4.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1"} 2.0\nvllm:spec_decode_num_drafts_created{engine="0"} 1e9\n'
            "vllm:spec_decode_num_draft_tokens_total 18.0\nvllm:spec_decode_num_accepted_tokens_total 7.0\n"
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 5.0\n')
    assert prometheus_spec_counts(text) == (18, 7, 6)
    assert prometheus_spec_counts("vllm:spec_decode_num_drafts_total 1.0\n") is None


def test_spec_modules_over_http() -> None:
    with local_server(MODEL, "qwen3-tiny", speculative_config=SPEC) as spec_url, \
            local_server(MODEL, "qwen3-tiny") as plain_url:
        good = _suite(spec_url, "--engine-arg", f"plain_url={plain_url}")
        false_claim = _suite(plain_url, "-k", "goldens")
    assert good.returncode == 0, good.stdout[-3000:]
    assert "speculates for every request" not in good.stdout, good.stdout[-3000:]
    assert "PASSED conformance/test_spec_decode.py::test_greedy_stops_inside_accepted_runs" in good.stdout  # compared
    assert re.search(r"qwen3-tiny option-ngram-k3, .*: [1-9]\d*/\d+ drafts accepted", good.stdout)  # from /metrics
    assert false_claim.returncode == 1 and "1 failed" in false_claim.stdout, false_claim.stdout[-3000:]
