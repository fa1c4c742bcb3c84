"""The rejection sampler (kernels/rejection.py): its distribution, its exact edge cases, the Triton kernel against
the reference.

The statistical tests run both the reference and the kernel (in the interpreter without a GPU) on one batch of
20,000 rows (one seed each) over a 7-token vocabulary. Each test has false-alarm rate 1e-5: a chi-square test
passes at p-value > 1e-5 (scipy's tail when installed, else the regularized gamma function's), a binomial count
within 4.42 standard deviations (two-sided normal tail 1e-5). The draws are counter-based, so a run is
deterministic: a pass stays a pass. The edge cases and the kernel comparison are exact.
"""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref.kernels._triton_common import triton
from nanovllm_ref.kernels.rejection import rejection_sample, rejection_sample_reference
from nanovllm_ref.kernels.sampling import gumbel_sample_reference

from .conftest import ON_GPU

N, V, ALPHA, Z = 20_000, 7, 1e-5, 4.42
SAMPLERS = [pytest.param(rejection_sample_reference, id="reference"),
            pytest.param(rejection_sample, id="triton",
                         marks=pytest.mark.skipif(triton is None, reason="needs triton"))]


def gamma_tail(stat: float, dof: int) -> float:
    """P(chi-square(dof) > stat) = Q(dof / 2, stat / 2), the regularized upper incomplete gamma function."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def chi2_sf(stat: float, dof: int) -> float:
    try:
        from scipy.stats import chi2
    except ImportError:
        return gamma_tail(stat, dof)
    return float(chi2.sf(stat, dof))


def assert_follows(tokens: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    """Pearson's chi-square of `tokens` against `probs` (every bin expects >= 5); tokens of probability 0 never."""
    probs = probs.double() / probs.double().sum()
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0, f"{what}: tokens of probability 0 drawn: {counts.tolist()}"
    expected = probs[probs > 0] * len(tokens)
    assert expected.min() >= 5, expected
    stat = float(((counts[probs > 0] - expected) ** 2 / expected).sum())
    p_value = chi2_sf(stat, len(expected) - 1)
    assert p_value > ALPHA, f"{what}: chi-square p = {p_value:.2e}; observed {counts.tolist()}, expected {expected}"


def assert_rate(hits: torch.Tensor, rate: float, what: str) -> None:
    n = hits.numel()
    sigma = (n * rate * (1 - rate)) ** 0.5
    assert abs(float(hits.sum()) - n * rate) <= Z * sigma, f"{what}: {int(hits.sum())} of {n}, expected {n * rate:.0f}"


def batch(p: torch.Tensor, q: torch.Tensor, num_drafts: int, seed: int = 0) -> tuple:
    """N rows of one (K+1, V) p and (K, V) q, drafts drawn from q by the plain sampler at the row's seed (as a
    draft model would), distinct seeds, positions past 2^32 included."""
    k = q.shape[0]
    gen = torch.Generator().manual_seed(seed)
    seeds = torch.randint(-(2**62), 2**62, (N,), generator=gen)
    positions = torch.randint(0, 2**33, (N,), generator=gen)
    drafts = torch.stack([gumbel_sample_reference(q[j].log().expand(N, -1), torch.ones(N), seeds, positions + j)[0]
                          for j in range(k)], dim=1)
    return (p.expand(N, -1, -1).contiguous(), q.expand(N, -1, -1).contiguous(), drafts,
            torch.full((N,), num_drafts), seeds, positions)


def random_probs(rows: int, seed: int, vocab: int = V) -> torch.Tensor:
    """Rows of probabilities >= 1/(4 vocab) each: every chi-square bin of N draws expects far more than 5."""
    gen = torch.Generator().manual_seed(seed)
    return 0.25 / vocab + 0.75 * (torch.randn(rows, vocab, generator=gen) * 1.2).softmax(dim=-1)


# ---- the distribution --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_emitted_tokens_follow_the_target(sampler):
    """Random p and q (K = 2): the first token follows p_0; draft 0 is accepted at rate sum min(p_0, q_0); the
    token at position 1 of the rows whose draft 0 was accepted follows p_1 (the conditional)."""
    p, q = random_probs(3, 1), random_probs(2, 2)
    inputs = batch(p, q, 2)
    out = sampler(*inputs)
    assert_follows(out[:, 0], p[0], "the first token")
    accepted = out[:, 1] >= 0  # a token after the first: draft 0 was accepted
    assert torch.equal(out[accepted, 0], inputs[2][accepted, 0])
    assert_rate(accepted, float(torch.minimum(p[0], q[0]).sum()), "draft 0 accepted")
    assert_follows(out[accepted, 1], p[1], "the second token after the first draft's acceptance")


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_zero_residual_falls_back_to_p(sampler):
    """p <= q everywhere (p unnormalised): a rejected draft leaves max(0, p - q) = 0, and the token is drawn from p
    (without the fallback every score is -inf and the draw is token 0)."""
    q = torch.full((1, 4), 0.25)
    p = torch.tensor([[0.2, 0.0, 0.05, 0.1], [0.25] * 4])
    inputs = batch(p, q, 1)
    inputs[2][:] = 0  # every draft token 0: accepted iff u * 0.25 < 0.2
    out = sampler(*inputs)
    rejected = out[:, 1] < 0  # no bonus: draft 0 was rejected
    assert (out[~rejected, 0] == 0).all()
    assert_rate(~rejected, 0.8, "draft 0 accepted")
    assert_follows(out[rejected, 0], p[0], "the token after a rejection")


# ---- exact edge cases --------------------------------------------------------------------------------------
def plain_draws(p: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # (B, V) -> (B,)
    return gumbel_sample_reference(p.log(), torch.ones(len(seeds)), seeds, positions)[0]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_q_equal_to_p_accepts_every_draft_and_the_bonus_is_the_plain_draw(sampler):
    """Drafts drawn by the plain sampler from q = p are all accepted, and the bonus is the plain sampler's draw at
    positions + num_drafts: the tokens are those of decoding without speculation."""
    k, b = 3, 64
    p = random_probs(b * (k + 1), 3, vocab=50).view(b, k + 1, 50)
    seeds, positions = torch.arange(b) * 7919 - 100, torch.arange(b) + 2**32 - 40
    num_drafts = torch.arange(b) % (k + 1)
    plain = torch.stack([plain_draws(p[:, j], seeds, positions + j) for j in range(k + 1)], dim=1)  # (B, K+1)
    out = sampler(p, p[:, :k].clone(), plain[:, :k].clone(), num_drafts, seeds, positions)
    col = torch.arange(k + 1)
    assert torch.equal(out, torch.where(col <= num_drafts[:, None], plain, -1))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_no_drafts_emit_the_plain_samplers_token(sampler):
    k, b = 2, 40
    p, q = random_probs(b * (k + 1), 4, vocab=30).view(b, k + 1, 30), random_probs(b * k, 5, vocab=30).view(b, k, 30)
    seeds, positions = torch.arange(b) * 31 + 2**40, torch.arange(b) * 1000
    out = sampler(p, q, torch.full((b, k), -1), torch.zeros(b, dtype=torch.int64), seeds, positions)
    assert torch.equal(out[:, 0], plain_draws(p[:, 0], seeds, positions))
    assert (out[:, 1:] == -1).all()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_one_hot_target_emits_its_token(sampler):
    """p one-hot at t_j: a draft is accepted iff it is t_j, and the token after the accepted ones is t_j too."""
    k, b, vocab = 3, 200, 10
    gen = torch.Generator().manual_seed(6)
    target = torch.randint(0, vocab, (b, k + 1), generator=gen)
    p = torch.nn.functional.one_hot(target, vocab).float()
    q = random_probs(b * k, 7, vocab).view(b, k, vocab)
    drafts = torch.where(torch.rand(b, k, generator=gen) < 0.7, target[:, :k], torch.randint(0, vocab, (b, k)))
    num_drafts = torch.randint(0, k + 1, (b,), generator=gen)
    out = sampler(p, q, drafts, num_drafts, torch.arange(b), torch.arange(b) * 3)
    col = torch.arange(k + 1)
    matching = (drafts == target[:, :k]).long().cumprod(dim=1).sum(dim=1)
    emitted = torch.minimum(matching, num_drafts) + 1  # (B,)
    assert torch.equal(out, torch.where(col < emitted[:, None], target, -1))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_draft_the_target_excludes_is_never_accepted(sampler):
    k = 2
    p = random_probs(k + 1, 8)
    p[0, 3] = 0.0
    inputs = batch(p, random_probs(k, 9), k)
    inputs[2][:, 0] = 3
    out = sampler(*inputs)
    assert (out[:, 0] != 3).all() and (out[:, 1:] == -1).all()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_padding_after_the_emitted_token(sampler):
    """Accepted drafts, exactly one more token, then -1 to the end; drafts past num_drafts (-1 here) ignored."""
    k, b = 4, 300
    p, q = random_probs(b * (k + 1), 10).view(b, k + 1, V), random_probs(b * k, 11).view(b, k, V)
    gen = torch.Generator().manual_seed(12)
    num_drafts = torch.randint(0, k + 1, (b,), generator=gen)
    drafts = torch.where(torch.arange(k) < num_drafts[:, None], torch.randint(0, V, (b, k), generator=gen), -1)
    out = sampler(p, q, drafts, num_drafts, torch.arange(b) - 50, torch.arange(b))
    emitted = (out >= 0).long().cumprod(dim=1).sum(dim=1)
    col = torch.arange(k + 1)
    assert out.shape == (b, k + 1) and out.dtype == torch.int64
    assert ((emitted >= 1) & (emitted <= num_drafts + 1)).all()
    assert torch.equal(out[:, :k][col[:k] < emitted[:, None] - 1], drafts[col[:k] < emitted[:, None] - 1])
    assert (out[col >= emitted[:, None]] == -1).all() and (out < V).all()
    assert (emitted <= num_drafts).any() and (emitted == num_drafts + 1).any()  # both endings occur


# ---- the kernel against the reference ------------------------------------------------------------------
def mixed_inputs(b: int, k: int, vocab: int, seed: int, device: str = "cpu") -> tuple:
    """Random p and q with excluded tokens, q = p rows, one-hot rows, drafts from q and some p excludes, every
    num_drafts in [0, K], seeds of either sign, positions across 2^32."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, vocab, generator=gen) * 2
    logits[torch.rand(b, k + 1, vocab, generator=gen) < 0.2] = float("-inf")
    logits[..., 0] = logits[..., 0].nan_to_num(neginf=0.0)  # never a row of zeros
    p = logits.softmax(dim=-1)
    q = (torch.randn(b, k, vocab, generator=gen) * 2).softmax(dim=-1)
    q[::3] = p[::3, :k]  # every third row: q = p (all accepted, the bonus drawn)
    p[1::4, :, :] = torch.nn.functional.one_hot(torch.randint(0, vocab, (b, k + 1), generator=gen), vocab)[1::4]
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(b, k) if b * k else q[..., 0].long()
    if k:
        drafts[::5, 0] = torch.randint(0, vocab, (len(drafts[::5]),), generator=gen)  # tokens p may exclude
    num_drafts = torch.arange(b) % (k + 1)
    seeds = torch.randint(-(2**62), 2**62, (b,), generator=gen)
    positions = torch.randint(2**32 - 10, 2**32 + 10, (b,), generator=gen)
    return tuple(t.to(device) for t in (p, q, drafts, num_drafts, seeds, positions))


@pytest.mark.parametrize("rows", [None, 1, 4])
@pytest.mark.parametrize("k,vocab", [(1, 6), (3, 50), (5, 1000), (3, 2500)])  # V = 2500: 3 blocks, the last partial
def test_kernel_matches_reference(k, vocab, rows):
    inputs = mixed_inputs(13, k, vocab, seed=k * vocab)  # 13 rows: the last program of 4 is partial
    assert torch.equal(rejection_sample(*inputs, rows_per_program=rows), rejection_sample_reference(*inputs))


def test_kernel_handles_an_empty_batch_and_no_draft_slots():
    empty = mixed_inputs(0, 2, 6, seed=0)
    assert rejection_sample(*empty).shape == (0, 3)
    inputs = mixed_inputs(5, 0, 40, seed=1)  # K = 0: the bonus alone
    assert torch.equal(rejection_sample(*inputs), rejection_sample_reference(*inputs))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("vocab", [32000, 151936])
def test_kernel_matches_reference_on_cuda(vocab):
    inputs = mixed_inputs(64, 5, vocab, seed=vocab, device="cuda")
    assert torch.equal(rejection_sample(*inputs), rejection_sample_reference(*inputs))


def test_the_fallback_chi_square_tail_is_scipys():
    chi2 = pytest.importorskip("scipy.stats").chi2
    for stat, dof in ((20.0, 6), (3.0, 1), (60.0, 5)):
        assert abs(gamma_tail(stat, dof) - float(chi2.sf(stat, dof))) < 1e-12 * max(1.0, float(chi2.sf(stat, dof)))
