"""llama.cpp's OpenAI-compatible server as a route of `nox -s peer-llamacpp` (tools/peer_local.py): for each
checkpoint its f32 GGUF (oracle/llamacpp_adapter.py ``convert``) is served by ``python -m llama_cpp.server`` on
127.0.0.1 (``--model_alias`` the checkpoint's path, so the adapter's name check holds), test_golden runs through
``--engine llamacpp:URL --engine-arg server_dtype=float32 --engine-arg echo=false``, and the server is stopped; on the
first checkpoint also with ``echo`` (prompt logprobs), which shows llama-cpp-python's echo bug (ECHO_BUG)."""

from __future__ import annotations

import sys
from pathlib import Path

from tools.peer_common import Server, pytest_conformance, rows_of

ROUTE = "HTTP (`python -m llama_cpp.server`, `--engine llamacpp:URL`)"
ECHO_BUG = ("llama-cpp-python 0.3.36's echo=True logprobs read each token's logprob from its own position's row (the "
            "next token's distribution) and drop the last token (tools/probe_peer_bugs.py llamacpp-echo)")

# the server's own bugs, on checkpoints that pass in-process
SERVER_BUGS = {"mistral-spm-hd32": "llama-cpp-python 0.3.36 names every byte-fallback token '' in its logprobs (the "
               "token's bytes decoded with errors='ignore'), so the ids of its answers cannot be recovered "
               "(tools/probe_peer_bugs.py llamacpp-byte-tokens)"}


def server_rows(label: str, models: list[str], out: Path, run_s: float, known: dict[str, str] | None = None,
                port: int = 8771, startup_s: float = 600.0) -> list[dict]:
    """One row per checkpoint (no echo), plus the echo row of the first; ``known``: checkpoint -> engine bug."""
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.llamacpp_adapter import convert

    rows = []
    for model in models:
        report, log = out / f"http-{model}.json", out / f"http-{model}.log"
        try:
            gguf = convert(checkpoint_path(model))
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias",
                   checkpoint_path(model), "--logits_all", "true", "--n_ctx", "512", "--n_threads", "1",
                   "--n_threads_batch", "1", "--type_k", "0", "--type_v", "0",  # f32 KV cache (default f16)
                   "--host", "127.0.0.1", "--port", str(port)]
            server = Server(cmd, f"http://127.0.0.1:{port}/v1/models", out / f"server-{model}.log", startup_s,
                            "llama.cpp")
        except (RuntimeError, OSError) as e:
            log.write_text(f"E   RuntimeError: {e}\n")
        else:
            url = f"llamacpp:http://127.0.0.1:{port}/v1"
            try:
                pytest_conformance(url, [model], ["float32"], report, log, run_s,
                                   ["server_dtype=float32", "echo=false"], tag="peer_llamacpp_server")
                if model == models[0]:
                    echo_report, echo_log = out / f"http-echo-{model}.json", out / f"http-echo-{model}.log"
                    pytest_conformance(url, [model], ["float32"], echo_report, echo_log, run_s,
                                       ["server_dtype=float32"], tag="peer_llamacpp_server")
            finally:
                server.stop()
        rows += rows_of(report, label, ROUTE + ", no prompt logprobs", [model], ["float32"], log,
                        {**(known or {}), **SERVER_BUGS})
        if model == models[0]:
            rows += rows_of(out / f"http-echo-{model}.json", label, ROUTE + ", `echo` (prompt logprobs)", [model],
                            ["float32"], out / f"http-echo-{model}.log", {model: ECHO_BUG})
    return rows
