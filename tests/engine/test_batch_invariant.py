"""`LLM(..., batch_invariant=True)` on the CPU: the config, and a needle's tokens and logprobs bitwise the same
alone, in a batch of 70 requests (more rows than any fixed tile), prompt-chunked by a 13-token budget, and after
a prefix-cache hit; the default mode is shown to differ on the same compositions (where this BLAS makes it)."""

from __future__ import annotations

import os
import random

import pytest

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.config import Config, ModelConfig, resolve_spec

from ..conftest import checkpoint_path

MODEL = "qwen3-tiny"  # GQA group 2: the attention units pack tokens x heads
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=5)
NEEDLE = list(range(40, 100))  # 60 tokens: several key tiles, four 16-token blocks


def test_config_flag() -> None:
    with pytest.raises(ValueError, match="batch_invariant must be a bool"):
        Config(model="m", batch_invariant=1)
    with pytest.raises(ValueError, match="batch_invariant=True needs attention_backend"):
        Config(model="m", batch_invariant=True, attention_backend="sdpa")
    path = str(checkpoint_path(MODEL))
    from transformers import AutoConfig

    model = ModelConfig.from_hf(AutoConfig.from_pretrained(path))
    spec = resolve_spec(Config(model=path, device="cpu", batch_invariant=True), model)
    assert spec.config.batch_invariant and spec.backend == "torch"  # "auto" on the CPU: the fixed-order torch path
    assert resolve_spec(Config(model=path, device="cpu"), model).backend == "sdpa"


def _fillers(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [NEEDLE[:32] + [rng.randrange(3, 500) for _ in range(rng.randint(1, 40))] for _ in range(n)]


def _needle_outputs(**engine) -> list[tuple[list[int], list[dict[int, float]]]]:
    """The needle alone, then at positions 0 / 35 / 69 of batches of 70 fillers sharing its first 32 tokens."""
    outs = []
    with LLM(str(checkpoint_path(MODEL)), device="cpu", dtype="float32", max_model_len=256, **engine) as llm:
        for i, pos in enumerate((None, 0, 35, 69)):
            batch = [NEEDLE] if pos is None else (lambda f: f[:pos] + [NEEDLE] + f[pos:])(_fillers(69, i))
            out = llm.generate(batch, PARAMS, use_tqdm=False)[0 if pos is None else pos]
            outs.append((out.token_ids, out.logprobs))
    return outs


@pytest.mark.parametrize("budget", [8192, 13], ids=["one-step-prompts", "chunked-13"])
def test_needle_is_bitwise_invariant(budget) -> None:
    alone, *batched = _needle_outputs(batch_invariant=True, max_num_batched_tokens=budget)
    assert len(alone[0]) == PARAMS.max_tokens  # a failed step would end every run alike, with no tokens
    for k, got in enumerate(batched):
        assert got == alone, f"batch {k}: the needle's tokens or logprobs differ from the needle alone"


def test_default_mode_is_not_bitwise_invariant() -> None:
    """What the mode is for: without it the same compositions change the needle's logprobs in their last bits."""
    alone, *batched = _needle_outputs()
    assert any(got != alone for got in batched)


def test_triton_backend_in_the_mode_runs_its_one_tile() -> None:
    """The CUDA path's attention (the prefill kernel with the mode's one tile, decode-only steps the decode kernel
    unsplit with the same tile) in the Triton interpreter: the needle alone and between fillers, prompt-chunked,
    gives the same tokens and logprobs to 1e-5.
    Not bitwise here: the interpreter's products are numpy's, which this check found not invariant to a row's place
    in the tile; the bitwise check of this path runs on CUDA (conformance/test_batch_invariance.py, -m gpu)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton backend on the CPU needs TRITON_INTERPRET=1")
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=2)
    with LLM(str(checkpoint_path(MODEL)), device="cpu", dtype="float32", max_model_len=128, batch_invariant=True,
             attention_backend="triton", max_num_batched_tokens=24) as llm:
        alone = llm.generate([NEEDLE], params, use_tqdm=False)[0]
        batch = _fillers(3, 7)
        mixed = llm.generate(batch[:1] + [NEEDLE] + batch[1:], params, use_tqdm=False)[1]
    assert len(alone.token_ids) == 3 and alone.finish_reason == "length", alone.finish_reason
    assert mixed.token_ids == alone.token_ids
    for got, want in zip(mixed.logprobs, alone.logprobs):
        assert got.keys() == want.keys() and all(abs(got[t] - want[t]) < 1e-5 for t in want)
