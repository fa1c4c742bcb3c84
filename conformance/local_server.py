"""nanovllm_ref's own OpenAI server, in a thread on a free local port, for test_serving.py under the default
``--engine nanovllm_ref`` (an in-process engine has no HTTP surface of its own, but nanovllm_ref ships one:
``python -m nanovllm_ref.serve``). A plain role/content template serves the chat route on checkpoints that
carry none (the golden ones)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

CHAT_TEMPLATE = ("{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}"
                 "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


@contextlib.contextmanager
def local_server(model_path: str, name: str, **engine: object) -> Iterator[str]:
    """Yields the server's base URL (``http://127.0.0.1:PORT/v1``) serving ``model_path`` as ``name``."""
    from nanovllm_ref import LLM
    from nanovllm_ref.serve.server import ServerConfig, bind, make_served, make_uvicorn

    llm = LLM(model_path, **{"dtype": "float32", "device": "cpu", "max_model_len": 512, **engine})
    config = ServerConfig(served_model_names=(name,), chat_template=CHAT_TEMPLATE, access_log=False)
    served = make_served(llm, config)
    sock = bind("127.0.0.1", 0)
    uv = make_uvicorn(served, config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    try:
        while not uv.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("nanovllm_ref's server did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        uv.should_exit = True
        thread.join(10)
        served.loop.stop()
        served.loop.join(10)
        llm.shutdown()
