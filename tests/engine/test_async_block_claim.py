"""Async decode does not claim a block for a token it knows will be dropped: a row that the step in flight ends by
its length limit (vLLM's async scheduler skips such rows too), so no cached block is evicted for it."""

from __future__ import annotations

import pytest

from nanovllm_ref import LLM, SamplingParams

BS = 16


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_a_request_ending_on_a_block_boundary_holds_only_its_computed_blocks(qwen3_path, async_scheduling) -> None:
    llm = LLM(qwen3_path, dtype="float32", device="cpu", kvcache_block_size=BS, num_kvcache_blocks=12,
              max_model_len=12 * BS, async_scheduling=async_scheduling)
    held = []
    free = llm.engine.block_manager.free
    llm.engine.block_manager.free = lambda seq: (held.append(len(seq.block_table)), free(seq))
    try:
        # 4 blocks + 1 prompt token, then 16 tokens: 80 computed tokens (5 full blocks); the 16th is never computed
        out = llm.generate([list(range(3, 3 + 4 * BS + 1))], SamplingParams(temperature=0.0, max_tokens=BS,
                                                                            ignore_eos=True), use_tqdm=False)[0]
    finally:
        llm.shutdown()
    assert len(out.token_ids) == BS
    assert held == [5], f"the request held {held} blocks: 5 hold its 80 computed tokens"


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_the_general_path_skips_a_row_whose_token_in_flight_ends_it(qwen3_path, async_scheduling) -> None:
    """A request waiting for blocks keeps the scheduler on its general path (an admission may happen every step):
    there too, the running request's last step in flight ends it by length, and nothing more is scheduled for it."""
    llm = LLM(qwen3_path, dtype="float32", device="cpu", kvcache_block_size=BS, num_kvcache_blocks=12,
              max_model_len=12 * BS, async_scheduling=async_scheduling)
    held = {}
    free = llm.engine.block_manager.free
    llm.engine.block_manager.free = lambda seq: (held.setdefault(seq.request_id, len(seq.block_table)), free(seq))
    params = SamplingParams(temperature=0.0, max_tokens=BS, ignore_eos=True)
    try:  # the second needs 9 blocks of the 12: it waits until the first has finished
        llm.generate([list(range(3, 3 + 4 * BS + 1)), list(range(200, 200 + 8 * BS + 1))], params, use_tqdm=False)
    finally:
        llm.shutdown()
    assert held["0"] == 5, f"the first request held {held['0']} blocks: 5 hold its 80 computed tokens"
