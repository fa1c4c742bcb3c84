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

from nanovllm_ref.testing.interpreter import use_triton_interpreter

use_triton_interpreter()

import pytest  # noqa: E402
import torch  # noqa: E402

# Hypothesis profiles come from the repo-root conftest (HYPOTHESIS_PROFILE=ci|dev|thorough).

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# bfloat16 only on the GPU: the interpreter truncates float32 -> bfloat16 instead of rounding to nearest
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
MAX_POSITION = 4096


def rope_inputs(head_dim: int, tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A RoPE cos/sin cache (Qwen's base 1e6, MAX_POSITION positions) and `tokens` random positions into it."""
    from nanovllm_ref.kernels.rotary import rope_cos_sin_cache

    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device=DEVICE).float() / head_dim))
    positions = torch.randint(0, MAX_POSITION, (tokens,), generator=gen, device=DEVICE)
    return rope_cos_sin_cache(inv_freq, MAX_POSITION), positions


def norm_weight(size: int, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """An RMSNorm weight near 1, as trained checkpoints have."""
    return (1 + 0.1 * torch.randn(size, generator=gen, device=DEVICE)).to(dtype)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if ON_GPU else "cpu"
