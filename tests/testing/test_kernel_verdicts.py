"""Kernel conformance verdicts (nanovllm_ref/testing/kernels.py, mismatch.py, conformance/test_kernels.py): a wrong
candidate fails with one short message (kernel, shapes, magnitude, worst element and both values, tolerance), and
a candidate that cannot run here (no triton) is skipped with its reason, listed once per candidate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.test_kernels import compare
from nanovllm_ref.testing.kernels import FIXED_INPUTS, KERNELS, KernelCandidate
from nanovllm_ref.testing.mismatch import KernelMismatch, triton_unavailable

ROOT = Path(__file__).resolve().parents[2]


def off_by_one_element(reference):
    def fn(*args):
        out = reference(*args)
        first = out[0] if isinstance(out, tuple) else out
        first.view(-1)[-1] += 1.0  # one element off: the message must point at it
        return out
    return fn


@settings(max_examples=3, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_wrong_kernel_fails_with_a_short_message_naming_the_worst_element(data) -> None:
    spec = KERNELS["rms_norm"]
    inputs = data.draw(spec.draws("small", (torch.float32,), 1.0, "cpu"))
    assert "tensor(" not in repr(inputs) and "float32[" in repr(inputs)  # what Hypothesis prints of a draw
    with pytest.raises(KernelMismatch) as e:
        compare(KernelCandidate("rms_norm", "wrong", off_by_one_element(spec.reference)), inputs, "magnitude x1")
    message = str(e.value)
    assert message.startswith("rms_norm [wrong] magnitude x1, inputs (float32[")
    assert "relative error" in message and "> tolerance 1e-05 (float32)" in message
    last = [i - 1 for i in inputs[0].shape]
    assert f"worst at {last}: candidate" in message and ", reference " in message
    assert "tensor(" not in message and len(message) < 400


def test_exact_kernels_name_the_first_differing_element() -> None:
    spec = KERNELS["gumbel_sample"]
    inputs = FIXED_INPUTS["gumbel_sample"]["vocab-across-splits"]("cpu")

    def wrong(*args):
        tokens, finite = spec.reference(*args)
        return tokens.flip(0), finite
    with pytest.raises(KernelMismatch, match=r"the tokens drawn must equal the reference's: \d+ of 5 elements differ, "
                                              r"first at \[0\]: candidate \d+, reference 20010"):
        compare(KernelCandidate("gumbel_sample", "wrong", wrong), inputs, "fixed inputs")


def test_without_triton_each_candidate_is_one_skip_line_with_its_reason() -> None:
    assert triton_unavailable() is None or "triton" in triton_unavailable()
    code = ("import sys; sys.modules['triton'] = None\n"  # importing triton now fails, as where it is not installed
            "import pytest\n"
            "sys.exit(pytest.main(['conformance/test_kernels.py', '-q', '-p', 'no:cacheprovider', "
            "'-k', 'rms_norm or decode_attention']))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HYPOTHESIS_PROFILE": "ci"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout
    assert proc.returncode == 0 and not re.search(r"\b[1-9]\d* failed", out), out[-3000:]
    section = out[out.index("kernel candidates skipped"):].splitlines()[1:]
    skipped = [line for line in section if line.startswith("kernel candidate ")]
    assert sorted(line.split(":")[0] for line in skipped) == [
        "kernel candidate decode_attention [triton-splits-1]",
        "kernel candidate decode_attention [triton-splits-3-longest-first]",
        "kernel candidate decode_attention [triton-splits-3]",
        "kernel candidate decode_attention [triton-splits-auto]", "kernel candidate rms_norm [triton]"]
    assert all("triton is not installed" in line for line in skipped)
    assert "passed" in out.splitlines()[-1]  # the sdpa candidates still ran
