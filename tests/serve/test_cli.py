"""The `nanovllm-ref` command line: help for every subcommand, `generate`, `chat` (streaming, over stdin), `serve`
as a real process (what the README runs), and `conformance` passing --engine/--model through to pytest."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.serve.cli import main

from ..conftest import QWEN3, checkpoint_path
from ..support.server import CHATML

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = [sys.executable, "-m", "nanovllm_ref.serve.cli"]
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
ENGINE = ["--dtype", "float32", "--max-model-len", "256"]


def run(*args: str, stdin: str = "", timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=ENV,
                          cwd=ROOT)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_lists_every_subcommand_and_each_has_help(capsys):
    code, out, _ = cli(capsys, "--help")
    assert code == 0
    for command in ("serve", "generate", "chat", "bench", "conformance"):
        assert command in out
        if command != "bench":
            code, sub, err = cli(capsys, command, "--help")
            assert code == 0 and "usage:" in sub, (command, err)
    assert "--served-model-name" in cli(capsys, "serve", "--help")[1]
    bench = run("bench", "--help")  # the benchmark's own help (nanovllm_ref/testing/bench/cli.py)
    assert bench.returncode == 0 and "usage: nanovllm-ref bench" in bench.stdout, bench.stderr[-2000:]
    if shutil.which("nanovllm-ref"):  # installed (pip install -e .): the console script is the same program
        assert "conformance" in subprocess.run(["nanovllm-ref", "--help"], capture_output=True, text=True).stdout


def test_generate_prints_what_the_engine_generates(capsys):
    path = str(checkpoint_path(QWEN3))
    code, out, err = cli(capsys, "generate", path, "def main(", "import os", *ENGINE, "--max-tokens", "8")
    assert code == 0, err
    with LLM(path, dtype="float32", max_model_len=256) as llm:
        refs = llm.generate(["def main(", "import os"], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    for prompt, ref in zip(["def main(", "import os"], refs):
        assert f"{prompt}{ref.text}" in out


def test_chat_streams_replies_and_keeps_the_history(capsys, monkeypatch):
    path = str(checkpoint_path(QWEN3))
    monkeypatch.setattr("sys.stdin", io.StringIO("import os\n\nclass A:\n"))  # an empty line: ignored; EOF quits
    code, out, err = cli(capsys, "chat", path, *ENGINE, "--chat-template", CHATML, "--max-tokens", "6")
    assert code == 0, err
    assert out.count("assistant> ") == 2 and out.count("you> ") == 4
    first = out.split("assistant> ")[1].split("you> ")[0].removesuffix("\n")
    with LLM(path, dtype="float32", max_model_len=256) as llm:
        prompt = "<|im_start|>user\nimport os<|im_end|>\n<|im_start|>assistant\n"
        assert first == llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0), use_tqdm=False)[0].text
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    code, _, err = cli(capsys, "chat", path, *ENGINE)
    assert code == 2 and "chat template" in err


def test_serve_as_a_process_answers_and_stops_on_sigint():
    cmd = [sys.executable, "-m", "nanovllm_ref.serve", str(checkpoint_path(QWEN3)), *ENGINE, "--port", "0",
           "--served-model-name", "tiny", "--chat-template", CHATML]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert "serving" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        base = line.split(" on ")[1].split()[0]  # http://127.0.0.1:PORT/v1
        for _ in range(100):
            try:
                with urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=5) as r:
                    assert r.status == 200
                break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                           "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(base + "/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.load(r)["usage"]["completion_tokens"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 0, proc.stderr.read()[-2000:]


def test_bad_flags_fail_before_the_model_loads(capsys):
    code, _, err = cli(capsys, "serve", QWEN3, "--chat-template", "/no/such/file")
    assert code == 2 and "--chat-template: no such file" in err
    code, _, err = cli(capsys, "serve", QWEN3, "--max-request-bytes", "0")
    assert code == 2 and "max_request_bytes must be >= 1" in err
    code, _, err = cli(capsys, "generate", str(checkpoint_path(QWEN3)), "x", "--config", "{nope")
    assert code == 2 and "--config: not valid JSON" in err


def test_conformance_passes_engine_and_model_through_to_pytest():
    out = run("conformance", "--engine", "nanovllm_ref", "--model", QWEN3, "--collect-only", "-q",
              "-p", "no:cacheprovider")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "test_golden" in out.stdout and QWEN3 in out.stdout


@pytest.mark.parametrize("argv", [["serve"], ["nope"], ["generate", "m"], ["generate", "m", "p", "--bogus"]])
def test_usage_errors_exit_2(capsys, argv):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and "error:" in err and "--help" in err


LAYERS = ["protocol", "params", "engine_loop", "metrics", "handlers", "routes", "docs", "app",
          "server", "chat", "cli", "__main__"]


def test_the_serving_package_imports_only_downward():
    import ast
    from pathlib import Path

    folder = Path(ROOT) / "nanovllm_ref" / "serve"
    assert sorted(p.stem for p in folder.glob("*.py")) == sorted(LAYERS + ["__init__"])
    for rank, name in enumerate(LAYERS):
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:  # `from .x import ...`
                assert LAYERS.index(node.module) < rank, f"{name} imports {node.module}, which is above it"
