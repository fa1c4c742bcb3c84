"""prepare_step's token columns (positions, slot mapping, input ids): the vectorized construction equals the per-token
definition (slot = block_table[p // block_size] * block_size + p % block_size) for any chunks of any sequences."""

from __future__ import annotations

import pickle
from array import array

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from nanovllm_ref import SamplingParams
from nanovllm_ref.engine.inputs import prepare_step
from nanovllm_ref.engine.scheduler import SchedulerOutput
from nanovllm_ref.engine.sequence import Sequence


@st.composite
def chunks(draw, block_size: int):
    """(sequence, number of new tokens): a chunk of a sequence at any computed offset, blocks from a shared pool."""
    tables = draw(st.lists(st.lists(st.integers(0, 10_000), min_size=1, max_size=8, unique=True),
                           min_size=1, max_size=6))
    out = []
    for table in tables:
        capacity = len(table) * block_size
        num_tokens = draw(st.integers(1, capacity))
        start = draw(st.integers(0, num_tokens - 1))
        end = draw(st.integers(start + 1, num_tokens))
        seq = Sequence("r", draw(st.lists(st.integers(0, 999), min_size=num_tokens, max_size=num_tokens)),
                       SamplingParams(max_tokens=1), seed=0)
        seq.block_table, seq.num_computed_tokens = array("i", table), start
        out.append((seq, end - start))
    return out


@given(block_size=st.sampled_from([1, 2, 16, 256]), data=st.data())
def test_token_columns_equal_per_token_definition(block_size, data):
    scheduled = data.draw(chunks(block_size))
    step = prepare_step(SchedulerOutput(scheduled=scheduled), block_size)
    positions, slots, ids = [], [], []
    for seq, n in scheduled:
        start = seq.num_computed_tokens
        positions += range(start, start + n)
        slots += [seq.block_table[p // block_size] * block_size + p % block_size for p in range(start, start + n)]
        ids += seq.token_ids[start : start + n]
    assert step.positions.tolist() == positions
    assert step.slot_mapping.tolist() == slots
    assert step.input_ids.tolist() == ids
    assert step.query_start_loc[-1] == step.num_tokens == len(ids)
    for i, (seq, _) in enumerate(scheduled):
        assert step.block_tables[i, : len(seq.block_table)].tolist() == seq.block_table.tolist()


@given(block_size=st.sampled_from([1, 16, 256]), data=st.data())
def test_tensor_parallel_wire_keeps_every_field(block_size, data):
    """A StepInput through pickle (workers.py sends one per step to every rank): every field (token columns, the
    zero-padded block tables, per-row lists, their types) arrives unchanged."""
    scheduled = data.draw(chunks(block_size))
    step = prepare_step(SchedulerOutput(scheduled=scheduled), block_size)
    got = pickle.loads(pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL))
    for i, (seq, _) in enumerate(scheduled):
        assert got.block_tables[i, : len(seq.block_table)].tolist() == seq.block_table.tolist()
        assert not got.block_tables[i, len(seq.block_table) :].any()
    for name in step.__dataclass_fields__:
        mine, theirs = getattr(step, name), getattr(got, name)
        assert type(mine) is type(theirs), name
        assert (np.array_equal(mine, theirs) if isinstance(mine, np.ndarray) else mine == theirs), name
