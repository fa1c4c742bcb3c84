"""Kernel tests: Triton kernels vs the pure-torch references.

Without a GPU the kernels run in the Triton interpreter (exact but slow): TRITON_INTERPRET must be set before
any @triton.jit function is defined (triton's own included), so it is set here, at the top of the conftest;
if a parent conftest or an earlier-collected test module already imported triton / the kernels in compiled
mode, they are reloaded (setting TRITON_INTERPRET=1 in the environment beforehand avoids that).

Hypothesis profiles: "ci" (selected when $CI is set, or with --hypothesis-profile=ci) is derandomized, so CI
runs are reproducible; "dev" (default) draws fresh random inputs each run. Both disable deadlines (the
interpreter is slow and the first GPU call compiles).
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules:
        # Something (a parent conftest, an earlier test module) imported triton in compiled mode: its own
        # @jit helpers (tl.zeros, tl.sum, tl.cdiv, ...) must be re-decorated for the interpreter, then ours.
        import triton.language
        import triton.language.standard

        importlib.reload(triton.language.standard)
        importlib.reload(triton.language)
    for name in ("_triton_common", "prefill_attention", "decode_attention", "store_kv", "rmsnorm", "rotary",
                 "activation", "fused_moe", "qkv_epilogue"):
        module = sys.modules.get(f"nanovllm_ref.kernels.{name}")
        if module is not None:
            importlib.reload(module)

import pytest  # noqa: E402

# Hypothesis profiles come from the repo-root conftest (HYPOTHESIS_PROFILE=ci|dev|thorough).

ON_GPU = torch.cuda.is_available()


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if ON_GPU else "cpu"
