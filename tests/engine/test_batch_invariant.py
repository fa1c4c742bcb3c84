"""`LLM(..., batch_invariant=True)` on the CPU: the config, and a needle's tokens and logprobs bitwise the same
alone, in a batch of 70 requests (more rows than any fixed tile), prompt-chunked by a 13-token budget, and after
a prefix-cache hit; the default mode is shown to differ on the same compositions (where this BLAS makes it)."""

from __future__ import annotations

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
    for k, got in enumerate(batched):
        assert got == alone, f"batch {k}: the needle's tokens or logprobs differ from the needle alone"


def test_default_mode_is_not_bitwise_invariant() -> None:
    """What the mode is for: without it the same compositions change the needle's logprobs in their last bits."""
    alone, *batched = _needle_outputs()
    assert any(got != alone for got in batched)
