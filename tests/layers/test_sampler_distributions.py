"""Sampling: the distribution each setting defines (tested on many draws, not one), and seeded
determinism that does not depend on the rest of the batch."""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.kernels.sampling import row_keys, uniform_noise
from nanovllm_ref.layers.sampler import SamplingBatch, apply_top_k_top_p, sample

from ..conftest import QWEN3, checkpoint_path

N = 20_000
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])


def draw(logits: torch.Tensor, temperature=1.0, top_k=-1, top_p=1.0, seeds=None, counters=None) -> torch.Tensor:
    """Token frequencies of N draws: by default N seeds at one position (counter 5)."""
    n = N
    batch = SamplingBatch(
        temperature=torch.full((n,), temperature), top_k=torch.full((n,), top_k, dtype=torch.int64),
        top_p=torch.full((n,), top_p),
        seeds=torch.arange(n, dtype=torch.int64) * 7919 + 1 if seeds is None else seeds,
        counters=torch.full((n,), 5, dtype=torch.int64) if counters is None else counters,
        needs_filter=top_k > 0 or top_p < 1,
    )
    tokens = sample(logits.expand(n, -1).clone(), batch)[0]
    return torch.bincount(tokens, minlength=logits.numel()).float() / n


def assert_close_to(freq: torch.Tensor, probs: torch.Tensor) -> None:
    sigma = (probs * (1 - probs) / N).sqrt()
    assert torch.all((freq - probs).abs() <= 5 * sigma + 1e-9), (freq, probs)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_distribution(temperature):
    assert_close_to(draw(LOGITS, temperature), (LOGITS / temperature).softmax(-1))


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_top_k_restricts_support_and_renormalizes(k):
    freq = draw(LOGITS, top_k=k)
    assert freq[k:].sum() == 0
    assert_close_to(freq[:k], LOGITS[:k].softmax(-1))


@pytest.mark.parametrize("p", [0.3, 0.6, 0.9])
def test_top_p_keeps_the_smallest_nucleus(p):
    probs = LOGITS.softmax(-1)
    keep = int((probs.cumsum(-1) - probs < p).sum())  # tokens whose preceding mass is below p
    freq = draw(LOGITS, top_p=p)
    assert freq[keep:].sum() == 0
    assert_close_to(freq[:keep], LOGITS[:keep].softmax(-1))


def test_filter_handles_rows_independently():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    out = apply_top_k_top_p(logits, torch.tensor([2, -1]), torch.tensor([1.0, 0.5]))
    assert torch.isfinite(out[0]).sum() == 2 and torch.isfinite(out[0, :2]).all()
    assert torch.isfinite(out[1]).sum() == 2 and torch.isfinite(out[1, -2:]).all()


def test_counter_uniform_is_uniform_and_deterministic():
    def counter_uniform(seeds, counters, vocab):  # the noise source of sampling
        return uniform_noise(row_keys(torch.tensor(seeds), torch.tensor(counters)), vocab)

    u = counter_uniform([1, 2], [0, 0], 100_000)
    assert torch.equal(u, counter_uniform([1, 2], [0, 0], 100_000))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert not torch.equal(u[0], u[1])


def test_gumbel_noise_is_finite_at_the_extreme_bits():
    """The largest hash value must not round to u = 1 (noise +inf would draw its token whatever the logit: it
    happened with 24 bits, once in 2^24 vocabulary entries, and the sampling conformance test caught it)."""
    from nanovllm_ref.kernels.sampling import uniform_from_bits

    u = uniform_from_bits(torch.tensor([0, 1, 2**23 - 2, 2**23 - 1]))
    assert (u > 0).all() and (u < 1).all() and torch.isfinite(-torch.log(-torch.log(u))).all()


def test_one_seed_draws_fresh_noise_at_every_position():
    """One seeded request over N positions: the noise must depend on the position, so the tokens follow the
    distribution instead of repeating one draw."""
    freq = draw(LOGITS, seeds=torch.full((N,), 1234, dtype=torch.int64), counters=torch.arange(N, dtype=torch.int64))
    assert_close_to(freq, LOGITS.softmax(-1))


def test_greedy_is_argmax():
    freq = draw(LOGITS, temperature=0.0)
    assert freq[0] == 1.0


@pytest.fixture(scope="module")
def llm():
    return LLM(str(checkpoint_path(QWEN3)), dtype="float32", device="cpu")


def test_same_seed_same_tokens_alone_or_in_a_batch_of_32(llm):
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=1234, max_tokens=24, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9]
    alone = llm.generate([prompt], params, use_tqdm=False)[0].token_ids
    others = [[10 + i, 11 + i, 12] for i in range(31)]
    mixed = [SamplingParams(temperature=0.8, max_tokens=10 + i, ignore_eos=True) for i in range(31)]
    batch = llm.generate([prompt] + others, [params] + mixed, use_tqdm=False)
    assert batch[0].token_ids == alone
    again = llm.generate([prompt], params, use_tqdm=False)[0].token_ids
    assert again == alone
    other_seed = llm.generate([prompt], SamplingParams(**{**params.__dict__, "seed": 99}), use_tqdm=False)
    assert other_seed[0].token_ids != alone  # 24 tokens from a peaked-but-not-degenerate model


def test_logprobs_shape_and_consistency(llm):
    params = SamplingParams(temperature=0, max_tokens=5, logprobs=4, prompt_logprobs=3, ignore_eos=True)
    out = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)[0]
    assert len(out.logprobs) == 5 and len(out.prompt_logprobs) == 4 and out.prompt_logprobs[0] is None
    for token, entry in zip(out.token_ids, out.logprobs):
        assert token in entry and len(entry) in (4, 5)
        assert entry[token] == max(entry.values())  # greedy picks the top logprob
    for token, entry in zip([6, 7, 8], out.prompt_logprobs[1:]):
        assert token in entry and len(entry) in (3, 4) and all(v <= 0 for v in entry.values())


@pytest.mark.parametrize("vocab", [1000, 5003, 151_936])
def test_gumbel_kernel_matches_reference(vocab):
    from nanovllm_ref.kernels.sampling import gumbel_sample, gumbel_sample_reference

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(vocab)
    n = 7
    logits = (torch.randn(n, vocab, generator=gen) * 3).to(device)
    logits[0, ::3] = float("-inf")  # masked entries (top-k/top-p) must never be drawn
    logits[5, vocab // 2] = float("nan")  # a broken row is flagged, whatever it samples
    logits[6, -1] = float("inf")
    temperature = torch.tensor([0.0, 0.5, 1.0, 2.0, 1.0, 0.0, 0.7], device=device)
    # seeds with high bits and negative seeds exercise the kernel's 64 -> 32-bit key folding
    seeds = torch.tensor([3, 7922, -5, 2**40 + 17, 2**63 - 1, 11, -(2**62)], device=device)
    counters = torch.arange(n, device=device) + 2**32 - 3  # and counters past 2^32 its wrap-around
    expected = gumbel_sample_reference(logits, temperature, seeds, counters)
    got = gumbel_sample(logits, temperature, seeds, counters)
    assert got.shape == (2, n) and got.dtype == torch.int64
    assert torch.equal(got[1], torch.tensor([0, 1, 1, 1, 1, 0, 0], device=device))
    assert torch.equal(got[:, :5], expected[:, :5]) and torch.equal(got[1], expected[1])
    assert got[0, 0] % 3 != 0


def test_sample_flags_non_finite_rows_on_every_path():
    """The finite flag is that of the model's logits, also when top-k / top-p writes -inf into them."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    logits[1, 7] = float("nan")
    for top_k, temperature in ((-1, 0.0), (-1, 0.8), (5, 0.8), (5, 0.0)):
        batch = SamplingBatch(temperature=torch.full((3,), temperature), top_k=torch.full((3,), top_k),
                              top_p=torch.ones(3), seeds=torch.arange(3), counters=torch.zeros(3, dtype=torch.int64),
                              needs_filter=top_k > 0)
        out = sample(logits.clone(), batch)
        assert out[1].tolist() == [1, 0, 1], (top_k, temperature)
        assert out[0, 0] in logits[0].topk(top_k if top_k > 0 else 50).indices
