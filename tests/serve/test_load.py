"""A bounded load test of the server: 64 concurrent streams all complete with their lengths; then 20 streams
dropped after a few chunks stop consuming engine steps within a second (their requests are aborted)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

httpx = pytest.importorskip("httpx")

from ..support.server import MODEL, running_server  # noqa: E402


async def _stream(client, prompt: list[int], max_tokens: int, keep_chunks: int | None = None) -> tuple[list, str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "ignore_eos": True,
            "stream": True}
    tokens, finish = [], None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            tokens += choice["token_ids"]
            finish = choice["finish_reason"] or finish
            if keep_chunks is not None and len(tokens) >= keep_chunks:
                break  # leaving the block closes the connection mid-stream
    return tokens, finish


async def _load(url: str, loop) -> None:
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        lengths = [8 + i % 17 for i in range(64)]
        results = await asyncio.gather(*[_stream(client, [3 + i % 50, 7, 9], n) for i, n in enumerate(lengths)])
        assert [len(tokens) for tokens, _ in results] == lengths
        assert all(finish == "length" for _, finish in results)
        assert not loop.active_request_ids()

        dropped = await asyncio.gather(*[_stream(client, [4, 5 + i], 400, keep_chunks=3) for i in range(20)])
        assert all(3 <= len(tokens) < 400 for tokens, _ in dropped)
        deadline = time.monotonic() + 1.0
        while loop.active_request_ids() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not loop.active_request_ids(), "dropped streams still hold engine requests after 1 s"
        steps = loop.num_steps
        await asyncio.sleep(0.3)
        assert loop.num_steps == steps, "the engine kept stepping for dropped streams"

        tokens, finish = await _stream(client, [5, 6, 7], 5)
        assert len(tokens) == 5 and finish == "length"


def test_64_concurrent_streams_then_20_dropped():
    with running_server() as server:
        asyncio.run(_load(server.url, server.served.loop))


def test_a_whole_response_whose_client_leaves_is_aborted():
    with running_server() as server, httpx.Client(base_url=server.url, timeout=0.5) as client:
        loop = server.served.loop
        step = loop.llm.step

        def slow_step():  # 400 steps take > 8 s: the client's 0.5 s timeout comes first
            time.sleep(0.02)
            return step()

        loop.llm.step = slow_step
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/completions", json={"model": MODEL, "prompt": [5, 6], "max_tokens": 400,
                                                 "ignore_eos": True})
        deadline = time.monotonic() + 1.0
        while loop.active_request_ids() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not loop.active_request_ids(), "the abandoned request is still in the engine after 1 s"
