"""`nanovllm-ref bench` and `nanovllm-ref serve` mistakes as a user meets them: one line on stderr, exit status 2,
no usage block and no traceback; `bench` with no arguments on a machine without a GPU says what to run instead,
and `serve` on a busy port says so before the model loads."""

from __future__ import annotations

import socket

import pytest
import torch

from nanovllm_ref.serve import cli
from nanovllm_ref.testing.bench.cli import CPU_SMOKE
from nanovllm_ref.testing.bench.cli import main as bench


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "usage:" not in err, err
    return lines[0]


def exit_code(fn, *args) -> int:
    try:
        return fn(*args)
    except SystemExit as e:  # argparse's own errors
        return e.code


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU answer")
def test_bench_without_arguments_on_a_cpu_names_the_cpu_command(capsys) -> None:
    assert exit_code(bench, []) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("nanovllm-ref bench: error: no CUDA GPU here") and CPU_SMOKE in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU answer")
def test_bench_on_cuda_without_a_gpu_is_one_line(capsys) -> None:
    assert exit_code(bench, ["--arch", "tiny", "--device", "cuda"]) == 2
    assert "--device cuda: no CUDA GPU here" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("args, message", [
    (["--tp", "0"], "--tp must be >= 1, got 0"),
    (["--workload", "nope"], "invalid choice: 'nope'"),
    (["--repeat", "x"], "invalid int value: 'x'"),
])
def test_a_bench_argument_error_is_one_line_without_the_usage(capsys, args, message) -> None:
    assert exit_code(bench, ["--device", "cpu", *args]) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_settings_the_engine_refuses_are_one_line_and_exit_2(capsys) -> None:
    args = ["--arch", "tiny", "--workload", "smoke", "--device", "cpu", "--max-model-len", "100000", "--no-ceilings",
            "--no-save", "--no-progress"]
    assert exit_code(bench, args) == 2
    assert "max_position_embeddings=4096" in one_error_line(capsys.readouterr().err)


def test_serve_on_a_busy_port_is_one_line_before_the_model_loads(capsys, monkeypatch) -> None:
    def no_loading(args):
        raise AssertionError("the model loaded before the port was checked")

    monkeypatch.setattr(cli, "load_llm", no_loading)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", "qwen3-tiny", "--dtype", "float32", "--port", str(port)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("nanovllm-ref serve: error: --host 127.0.0.1 --port") and str(port) in line
    assert "cannot listen there" in line
