"""engine/staging.py: a step's arrays on the device with one copy, each in its dtype, and the decode order."""

from __future__ import annotations

from array import array

import numpy as np
import torch

from nanovllm_ref import SamplingParams
from nanovllm_ref.engine.inputs import prepare_step
from nanovllm_ref.engine.scheduler import SchedulerOutput
from nanovllm_ref.engine.sequence import Sequence
from nanovllm_ref.engine.staging import stage_step, upload


def test_decode_steps_carry_the_longest_context_first_order() -> None:
    """stage_step sorts a decode step's sequences for the decode kernel on the host (ties keep batch order: the
    kernel's bits do not depend on it, tests/kernels/test_kernel_attention.py); prefill steps carry none."""
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
    arrays = [([1, 2, 3], torch.int64), ([4, 5], torch.int32), ([0.5, -1.25], torch.float32), ([], torch.int64),
              (np.array([7, 8, 9], np.int32), torch.int32), ([2**40], torch.int64)]
    out = upload(arrays, torch.device("cpu"))
    for (values, dtype), t in zip(arrays, out):
        assert t.dtype == dtype and t.tolist() == list(values) and t.data_ptr() % 16 == 0
