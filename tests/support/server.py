"""A real server for the serving tests: uvicorn on 127.0.0.1 at a free port, in a thread, over qwen3-tiny
(float32) with the ChatML template of tests/data and a 1 MiB body limit (other server settings: `server=`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nanovllm_ref import LLM
from nanovllm_ref.chat_template import read_chat_template
from nanovllm_ref.serve.routes import Served
from nanovllm_ref.serve.server import ServerConfig, bind, make_served, make_uvicorn

from ..conftest import QWEN3, checkpoint_path

CHATML = str(Path(__file__).resolve().parents[1] / "data" / "chatml.jinja")
MODEL = "qwen3-tiny"


@dataclass
class Running:
    url: str  # http://127.0.0.1:PORT
    served: Served

    @property
    def base(self) -> str:
        return self.url + "/v1"


@contextlib.contextmanager
def running_server(server: dict | None = None, **engine: object) -> Iterator[Running]:
    llm = LLM(str(checkpoint_path(QWEN3)), **{"dtype": "float32", "max_model_len": 512, **engine})
    config = ServerConfig(**{"served_model_names": (MODEL, "tiny"), "chat_template": read_chat_template(CHATML),
                             "max_request_bytes": 1 << 20, **(server or {})})
    served = make_served(llm, config)
    sock = bind("127.0.0.1", 0)
    uv = make_uvicorn(served, config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}", served)
    finally:
        uv.should_exit = True
        thread.join(10)
        served.loop.stop()
        served.loop.join(10)
        llm.shutdown()
