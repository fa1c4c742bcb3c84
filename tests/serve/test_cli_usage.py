"""`nanovllm-ref` as a user meets it: `--version`; every mistake on the command line (a wrong path, an unknown
dtype, a number out of range or not a number, a bad flag) is one line on stderr and exit status 2, before any
model loads, and `--debug` shows the traceback instead; golden checkpoint names work from any folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import nanovllm_ref
from nanovllm_ref.serve.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}


def run(args: list[str], cwd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanovllm_ref.serve.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=cwd)


def test_version_prints_the_package_version(tmp_path):
    out = run(["--version"], str(tmp_path))
    assert out.returncode == 0 and out.stdout.strip() == f"nanovllm-ref {nanovllm_ref.__version__}", out


MISTAKES = {
    "a wrong path": (["generate", "/no/such/folder", "x"], "neither a checkpoint folder nor a golden checkpoint"),
    "an unknown golden name": (["chat", "qwen3-tny"], "'qwen3-tny' does not exist: it is neither"),
    "a folder without a checkpoint": (["generate", ".", "x"], "has no config.json"),
    "an unknown dtype": (["generate", "qwen3-tiny", "x", "--dtype", "float64"], "invalid choice: 'float64'"),
    "a negative max-tokens": (["generate", "qwen3-tiny", "x", "--max-tokens", "-3"], "max_tokens must be an int"),
    "a zero max-model-len": (["serve", "qwen3-tiny", "--max-model-len", "0"], "max_model_len must be an int >= 1"),
    "a port out of range": (["serve", "qwen3-tiny", "--port", "70000"], "port must be in [0, 65535]"),
    "a word for a number": (["chat", "qwen3-tiny", "--max-tokens", "many"], "invalid int value: 'many'"),
    "a temperature out of range": (["generate", "qwen3-tiny", "x", "--temperature", "-1"], "temperature"),
    "an unknown engine setting": (["generate", "qwen3-tiny", "x", "--config", '{"max_num_seq": 2}'],
                                  "unknown LLM config key(s) ['max_num_seq']"),
    "a prompt longer than the context": (["generate", "qwen3-tiny", "a b c d e f g h", "--max-model-len", "16",
                                          "--max-tokens", "15"], "exceeds max_model_len=16"),
    "an unknown flag": (["generate", "qwen3-tiny", "x", "--bogus"], "unrecognized arguments: --bogus"),
    "batch-invariant with sdpa": (["generate", "qwen3-tiny", "x", "--batch-invariant", "--config",
                                   '{"attention_backend": "sdpa"}'], "batch_invariant=True needs attention_backend"),
    "no command": ([], "required: COMMAND"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_mistake_is_one_line_and_exit_status_2(tmp_path, monkeypatch, capsys, mistake):
    args, message = MISTAKES[mistake]
    monkeypatch.chdir(tmp_path)
    try:
        code = main(args)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out = capsys.readouterr()
    assert code == 2, out
    assert out.err.count("\n") == 1 and out.err.startswith("nanovllm-ref") and message in out.err, out.err
    assert out.out == ""


def test_a_mistake_in_a_process_is_one_line_too(tmp_path):
    out = run(["serve", "/no/such/folder", "--dtype", "float16"], str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "/no/such/folder" in out.stderr, out


def test_debug_shows_the_traceback(tmp_path):
    out = run(["generate", "qwen3-tiny", "x", "--max-tokens", "-3", "--debug"], str(tmp_path))
    assert out.returncode != 0 and "Traceback" in out.stderr and "max_tokens must be an int" in out.stderr
    assert run(["--debug", "serve", "qwen3-tiny", "--port", "70000"], str(tmp_path)).stderr.count("Traceback") == 1


def test_golden_names_work_from_any_folder(tmp_path):
    out = run(["generate", "qwen3-tiny", "def f(", "--max-tokens", "4", "--dtype", "float32"], str(tmp_path))
    assert out.returncode == 0 and "(4 tokens, length)" in out.stdout, out.stderr[-2000:]
    code = ("from golden.load import resolve_model; from nanovllm_ref import LLM\n"
            "print(LLM(resolve_model('qwen3-tiny')).generate('def f(', use_tqdm=False)[0].finish_reason)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["length"], out.stderr[-2000:]


def test_version_help_and_mistakes_answer_without_loading_torch(tmp_path):
    code = ("import sys; from nanovllm_ref.serve.cli import main\n"
            "for argv in (['generate', 'qwen3-tny', 'x'], ['serve', 'qwen3-tiny', '--max-model-len', '0'],\n"
            "             ['chat', 'qwen3-tiny', '--port'], ['--version'], ['--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("error:") == 3 and "nanovllm-ref 0.1.0" in out.stdout
