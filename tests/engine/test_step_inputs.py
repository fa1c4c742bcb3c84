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
    assert step.query_start_loc[-1] == len(ids) and step.pending == []
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


def test_decode_steps_carry_the_longest_context_first_order() -> None:
    """stage_step sorts a decode step's sequences for the decode kernel on the host (ties keep batch order: the
    kernel's bits do not depend on it, tests/kernels/test_kernel_attention.py); prefill steps carry none."""
    import torch

    from nanovllm_ref.engine.model_runner import stage_step

    seqs = []
    for i, n in enumerate([5, 9, 5, 12, 1]):
        seq = Sequence("r", list(range(n)), SamplingParams(max_tokens=1), seed=0)
        seq.block_table, seq.num_computed_tokens = array("i", [i]), n - 1
        seqs.append((seq, 1))
    decode = prepare_step(SchedulerOutput(scheduled=seqs), 16)
    meta = stage_step(decode, torch.device("cpu"), 64)[2]
    assert meta.decode_order.tolist() == [3, 1, 0, 2, 4]
    seqs[0][0].num_computed_tokens = 0
    prefill = prepare_step(SchedulerOutput(scheduled=[(seqs[0][0], 5), *seqs[1:]]), 16)
    assert stage_step(prefill, torch.device("cpu"), 64)[2].decode_order is None


def test_upload_views_each_array_in_its_dtype_at_a_16_byte_boundary():
    """One buffer, one copy: int64, int32 and float32 arrays (lists, numpy, empty) come back as their dtypes, each at
    a 16-byte boundary (Triton specializes on a pointer's alignment: one that followed the step's sizes would compile
    new kernel variants mid-run)."""
    import torch

    from nanovllm_ref.engine.model_runner import upload

    arrays = [([1, 2, 3], torch.int64), ([4, 5], torch.int32), ([0.5, -1.25], torch.float32), ([], torch.int64),
              (np.array([7, 8, 9], np.int32), torch.int32), ([2**40], torch.int64)]
    out = upload(arrays, torch.device("cpu"))
    for (values, dtype), t in zip(arrays, out):
        assert t.dtype == dtype and t.tolist() == list(values) and t.data_ptr() % 16 == 0
