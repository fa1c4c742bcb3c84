"""The server's engine loop over the engine's DELTA outputs: per sample, Deltas (tokens, logprobs, text that can
no longer change) and then the whole RequestOutput, all n samples joined, equal to what `generate` returns; the
observer counts every token once and each request's first token and end once."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from golden.load import checkpoint_path
from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.outputs import RequestOutput
from nanovllm_ref.serve.engine_loop import Delta, EngineLoop, LoopObserver

from ..conftest import QWEN3


class _Counts(LoopObserver):
    def __init__(self) -> None:
        self.tokens, self.first, self.finished, self.stats = 0, 0, [], []

    def on_step(self, stats):
        self.stats.append(stats)

    def on_first_token(self, num_prompt_tokens, ttft_s):
        self.first += 1

    def on_tokens(self, num_tokens):
        self.tokens += num_tokens

    def on_finished(self, out, arrival, first_token, now):
        self.finished.append(out)


@pytest.fixture(scope="module")
def llm():
    with LLM(checkpoint_path(QWEN3), dtype="float32", max_model_len=256) as llm:
        yield llm


async def _serve(loop: EngineLoop, prompts, params) -> dict[str, list]:
    inbox: asyncio.Queue = asyncio.Queue()
    rids = [loop.submit(p, sp, inbox) for p, sp in zip(prompts, params)]
    items: dict[str, list] = {rid: [] for rid in rids}
    while any(not (its and isinstance(its[-1], RequestOutput)) for its in items.values()):
        rid, item = await asyncio.wait_for(inbox.get(), 60)
        items[rid].append(item)
    return items


def test_deltas_then_the_joined_output_equal_generates(llm):
    stop = llm.tokenizer.decode(llm.generate([[5, 6, 7]], SamplingParams(max_tokens=12, temperature=0),
                                             use_tqdm=False)[0].token_ids[4:6])
    params = [SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=3, logprobs=1, prompt_logprobs=1),
              SamplingParams(max_tokens=12, temperature=0, stop=[stop] if stop.strip() else [], ignore_eos=True)]
    prompts = [[5, 6, 7, 8], [5, 6, 7]]
    finals = llm.generate(prompts, params, use_tqdm=False)
    counts = _Counts()
    loop = EngineLoop(llm, counts)
    loop.start()
    try:
        items = asyncio.run(_serve(loop, prompts, params))
    finally:
        loop.stop()
        loop.join(10)
    for its, final, sp in zip(items.values(), finals, params):
        *deltas, last = its
        assert deltas and all(isinstance(d, Delta) for d in deltas) and last.finished and len(last.outputs) == sp.n
        for i, (mine, theirs) in enumerate(zip(last.outputs, final.outputs)):
            assert dataclasses.astuple(mine) == dataclasses.astuple(theirs)
            streamed = [d for d in deltas if d.index == i]
            tokens = [t for d in streamed for t in d.token_ids]
            text = "".join(d.text for d in streamed)
            assert tokens == theirs.token_ids[: len(tokens)] and theirs.text.startswith(text)
            if sp.logprobs is not None:
                assert [lp for d in streamed for lp in d.logprobs] == theirs.logprobs[: len(tokens)]
            firsts = [d.prompt_logprobs for d in streamed[:1]]
            assert firsts in ([], [final.prompt_logprobs]) and all(d.prompt_logprobs is None for d in streamed[1:])
        assert last.prompt_logprobs == final.prompt_logprobs and last.num_cached_tokens == final.num_cached_tokens
    assert counts.tokens == sum(len(c.token_ids) for f in finals for c in f.outputs)
    assert counts.first == 2 and len(counts.finished) == 2 and not loop.active_request_ids()
    assert {"num_running", "num_waiting", "kv_cache_usage"} <= set(counts.stats[-1])
