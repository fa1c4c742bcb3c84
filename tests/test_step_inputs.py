"""prepare_step's slot mapping: the block-run construction equals the per-token definition
(slot = block_table[p // block_size] * block_size + p % block_size) for any chunk of any sequence."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nanovllm_ref.engine.inputs import _slots


@given(block_size=st.sampled_from([1, 2, 16, 256]), data=st.data())
def test_slots_by_block_runs_equal_per_token_slots(block_size, data):
    table = data.draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=12, unique=True))
    start = data.draw(st.integers(0, len(table) * block_size - 1))
    end = data.draw(st.integers(start, len(table) * block_size))
    expected = [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
    assert _slots(table, start, end, block_size) == expected
