"""tools/peer_vllm.py's HTTP route without vLLM: the suite is pointed at the server the route started
(``openai:http://127.0.0.1:PORT/v1``). A stdlib HTTP server stands in for vLLM's (started and stopped by the real
``peer_common.Server``); the pytest run is recorded, not made. The route had lost the server's URL when ``Server``
moved to peer_common (``AttributeError: 'Server' object has no attribute 'url'`` in `nox -s peer-vllm`, 2026-12-07).
"""

from __future__ import annotations

import socket
import sys
import types

from tools import peer_vllm
from tools.peer_common import Server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_http_route_points_the_suite_at_the_server_it_started(monkeypatch, tmp_path) -> None:
    port, engines, servers = free_port(), [], []

    def stand_in(model_path, dtype, port_, log, startup_s):
        servers.append(Server([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              f"http://127.0.0.1:{port}/", log, 60, "stdlib"))
        return servers[-1]

    monkeypatch.setattr(peer_vllm, "vllm_server", stand_in)
    monkeypatch.setattr(peer_vllm, "pytest_conformance", lambda engine, *args, **kwargs: engines.append(engine) or 0)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.0-stand-in"))
    peer_vllm.main(["--models", "qwen3-gqa4", "--dtypes", "float32", "--routes", "http", "--out", str(tmp_path)])
    assert engines == [f"openai:http://127.0.0.1:{port}/v1"]
    assert servers[0].proc.poll() is not None  # stopped after its run
