"""Short verdicts for kernel checks (testing/kernels.py): which kernel, on what shapes, at what magnitude, how far
off, the worst element with both values and the tolerance, never a whole tensor; and whether a candidate can
run here at all (triton installed, a CUDA GPU or Triton's interpreter).

A failing check raises :class:`KernelMismatch` (an AssertionError) with one or two lines; the drawn inputs print
as their shapes (:func:`describe`), so Hypothesis' report of the falsifying example stays short too.
"""

from __future__ import annotations

import os
from typing import Any

import torch


class KernelMismatch(AssertionError):
    """A candidate's output differs from the reference's (the message says where and by how much)."""


def describe(value: Any) -> str:
    """A tensor as ``dtype[shape]``, containers element by element, anything else by its repr (cut to 60)."""
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(describe(v) for v in value) + ")"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Described(tuple):
    """A kernel's input tuple whose repr is :func:`describe`'s (Hypothesis prints the drawn inputs on failure)."""

    def __repr__(self) -> str:
        return describe(tuple(self))


def _index(flat: int, shape: torch.Size) -> list[int]:
    return [int(i) for i in torch.unravel_index(torch.tensor(flat), shape)] if len(shape) else []


def worst_element(out: torch.Tensor, ref: torch.Tensor) -> str:
    """Where |out - ref| is largest (NaN first): ``at [i, j]: candidate x, reference y``."""
    diff = (out.double() - ref.double()).abs().nan_to_num(nan=float("inf")).flatten()
    if diff.numel() == 0:
        return "no elements"
    flat = int(diff.argmax())
    idx = _index(flat, out.shape)
    return f"worst at {idx}: candidate {out.flatten()[flat].item():.6g}, reference {ref.flatten()[flat].item():.6g}"


def first_difference(out: torch.Tensor, ref: torch.Tensor) -> str:
    """The first element where ``out`` and ``ref`` differ (NaN equal to NaN), with both values, and how many do."""
    same = (out == ref) | (out.isnan() & ref.isnan()) if out.is_floating_point() else out == ref
    bad = (~same).flatten().nonzero()
    if bad.numel() == 0:
        return "no difference"
    flat = int(bad[0])
    return (f"{bad.numel()} of {same.numel()} elements differ, first at {_index(flat, out.shape)}: candidate "
            f"{out.flatten()[flat].item():.6g}, reference {ref.flatten()[flat].item():.6g}")


def check_same_layout(out: torch.Tensor, ref: torch.Tensor) -> None:
    if out.shape != ref.shape or out.dtype != ref.dtype:
        raise KernelMismatch(f"output {describe(out)}, reference {describe(ref)}")


def check_equal(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """Bitwise equality (NaN equal to NaN)."""
    check_same_layout(out, ref)
    same = (out == ref) | (out.isnan() & ref.isnan()) if out.is_floating_point() else out == ref
    if not bool(same.all()):
        raise KernelMismatch(f"{what} must equal the reference's: {first_difference(out, ref)}")


def triton_unavailable() -> str | None:
    """Why a Triton kernel cannot run here (None when it can): triton missing, or neither a CUDA GPU nor
    Triton's interpreter (TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed (pip install triton, or nanovllm_ref[conformance])"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "no CUDA GPU and Triton's interpreter is off (TRITON_INTERPRET=1 runs it on the CPU)"
    return None
