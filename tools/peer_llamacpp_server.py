"""llama.cpp's OpenAI-compatible server as a route of `nox -s peer-llamacpp` (tools/peer_local.py): for each
checkpoint its f32 GGUF (oracle/llamacpp_adapter.py ``convert``) is served by ``python -m llama_cpp.server`` on
127.0.0.1 (``--model_alias`` the checkpoint's path, so the adapter's name check holds), test_golden runs through
``--engine llamacpp:URL --engine-arg server_dtype=float32``, and the server is stopped."""

from __future__ import annotations

import sys
from pathlib import Path

from tools.peer_common import Server, pytest_conformance, rows_of

ROUTE = "HTTP (`python -m llama_cpp.server`, `--engine llamacpp:URL`)"


def server_rows(label: str, models: list[str], out: Path, run_s: float, port: int = 8771,
                startup_s: float = 600.0) -> list[dict]:
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.llamacpp_adapter import convert

    rows = []
    for model in models:
        report, log = out / f"http-{model}.json", out / f"http-{model}.log"
        try:
            gguf = convert(checkpoint_path(model))
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
                   checkpoint_path(model), "--logits_all", "true", "--n_ctx", "512", "--n_threads", "1",
                   "--n_threads_batch", "1", "--host", "127.0.0.1", "--port", str(port)]
            server = Server(cmd, f"http://127.0.0.1:{port}/v1/models", out / f"server-{model}.log", startup_s,
                            "llama.cpp")
        except (RuntimeError, OSError) as e:
            log.write_text(f"E   RuntimeError: {e}\n")
        else:
            try:
                pytest_conformance(f"llamacpp:http://127.0.0.1:{port}/v1", [model], ["float32"], report, log, run_s,
                                   ["server_dtype=float32"], tag="peer_llamacpp_server")
            finally:
                server.stop()
        rows += rows_of(report, label, ROUTE, [model], ["float32"], log)
    return rows
