"""No Triton compile after `LLM()` returns: a request must never wait ~1 s for a kernel variant (GPU only).

Triton compiles a kernel once per set of constexprs and per specialization of its integer / pointer arguments
(== 1, divisible by 16). Arguments that change from step to step (a step's widest block table, the number of
(token, expert) pairs, the batch's rows of a packed parameter tensor) are marked `do_not_specialize`; the rest
are compiled by the engine's warm-up and CUDA-graph capture. This test runs prompts of assorted lengths (block
tables of 1, 16 and other widths, long and short query tiles), prefix-cache hits (short queries over long
contexts), greedy and sampled rows and top-k, and counts the compiled variants of every kernel before and after.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch

import nanovllm_ref.kernels as kernels
from golden.load import checkpoint_path
from nanovllm_ref import LLM, SamplingParams


def compiled_variants() -> dict[str, int]:
    """kernel name -> number of compiled variants (triton >= 3.2 keeps them in `device_caches`)."""
    counts = {}
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, fn in vars(module).items():
            if hasattr(fn, "device_caches"):
                counts[f"{info.name}.{name}"] = sum(len(cache[0]) for cache in fn.device_caches.values())
    return counts


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["qwen3-tiny", "qwen3-moe-tiny"])
def test_no_triton_compile_after_init(name: str) -> None:
    with LLM(str(checkpoint_path(name)), dtype="bfloat16", max_model_len=1024) as llm:
        before = compiled_variants()
        assert sum(before.values()) > 0  # the counter sees the warm-up's kernels
        lengths = [1, 3, 16, 17, 100, 255, 256, 257, 513, 900]
        prompts = [[(5 * i + j) % 1000 + 2 for j in range(n)] for i, n in enumerate(lengths)]
        params = [SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0 if i % 3 == 0 else 0.8, seed=i,
                                 top_k=20 if i % 3 == 2 else -1) for i in range(len(prompts))]
        llm.generate(prompts, params, use_tqdm=False)
        llm.generate(prompts[::-1], params, use_tqdm=False)  # prefix-cache hits: short queries, long contexts
        for p, sp in zip(prompts, params):  # one at a time: other batch sizes and table widths
            llm.generate([p], sp, use_tqdm=False)
        after = compiled_variants()
    assert after == before, {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
