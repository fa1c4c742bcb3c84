"""A statistical check of any engine's speculative-decoding rejection sampler on synthetic target and draft probs.

`check_rejection_sampler(fn)` runs `fn`, which takes `rejection_sample_reference`'s signature (kernels/rejection.py:
p (B, K+1, V), q (B, K, V), the drafts, num_drafts, seeds, positions -> (B, K+1) tokens then -1), on batches of
many seeds over a small vocabulary, and returns its failures (empty: pass). What the rule guarantees (Leviathan et
al. 2023, "Fast Inference from Transformers via Speculative Decoding", Theorem 1; Chen et al. 2023) and is checked:

* layout (exact): int64 (B, K+1); the emitted tokens come first, then -1 to the end; at least one, at most
  num_drafts + 1 of them; all but the last are the row's drafts; every token is in [0, V);
* the acceptance counts: draft j is accepted, given that drafts 0..j-1 were, with probability
  alpha_j = sum_v min(p_j, q_j) (1 where q = p, 0 where they are disjoint), so the number accepted follows
  P(k) = alpha_0 ... alpha_{k-1} (1 - alpha_k) (k < num_drafts), alpha_0 ... alpha_{n-1} (k = n); and the
  first draft's acceptance rate alone (a binomial) is alpha_0;
* the marginals: the token at position j of the rows that reach it (drafts 0..j-1 accepted) follows p_j
  (normalised), whichever way it came (an accepted draft, a recovered or a bonus token); tokens p excludes never.

The cases, in one batch per K (so rows of different num_drafts and distributions sit side by side): q disjoint
from p (K = 1 and 3: never accepted), random p and q with excluded tokens (K = 1: little overlap, most drafts
rejected; K = 3: q half p, every position reached often), q = p (K = 3: every draft accepted), one draft of K = 3
(the rows past it hold one-hot distributions: they must be ignored) and no draft (the bonus alone). The number
accepted is read from the output as the emitted tokens less one. The drafts are drawn from q with the plain sampler
(`gumbel_sample_reference`) at the row's seed and their positions, as an engine's draft model would: a sampler
whose acceptance noise is the plain sampler's correlates with them and fails.

Each distributional comparison is a G-test (`oracle.sampling_reference.g_test`: bins of expected count >= 5, a
pooled tail; outcomes of probability 0 are failures outright); the family-wise false-alarm rate is `alpha`
(Bonferroni: each of the m tests passes at p-value > alpha / m). 2 calls of `fn`, 28,000 rows in all; with the
reference ~1 s on the CPU, with nanovllm_ref's Triton kernel in the interpreter ~2 s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels.sampling import gumbel_sample_reference
from .sampling_reference import GTest, g_test


@dataclass
class _Case:
    name: str
    p: torch.Tensor  # (K+1, V) float32
    q: torch.Tensor  # (K, V) float32
    num_drafts: int


def _random_probs(rows: int, vocab: int, gen: torch.Generator, zeros: int = 0) -> torch.Tensor:
    logits = torch.randn(rows, vocab, generator=gen) * 1.5
    for r in range(rows):  # `zeros` tokens excluded (a top-k / top-p mask), never the whole row
        logits[r, torch.randperm(vocab, generator=gen)[:zeros]] = float("-inf")
    return logits.softmax(dim=-1)


def _cases(k: int, vocab: int, gen: torch.Generator) -> list[_Case]:
    half = torch.arange(vocab) < vocab // 2
    p, q = _random_probs(k + 1, vocab, gen) * half, _random_probs(k, vocab, gen) * ~half  # p on one half, q the other
    disjoint = _Case(f"q disjoint from p, K={k}", p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True), k)
    if k == 1:  # little overlap, zeros in both: most drafts rejected, so the recovered token's draw is checked
        return [disjoint, _Case(f"random p and q, K={k}", _random_probs(k + 1, vocab, gen, zeros=2),
                                _random_probs(k, vocab, gen, zeros=2), k)]
    p = _random_probs(k + 1, vocab, gen, zeros=2)  # q half p, half another: every position reached often
    mixed = _Case(f"random p and q, K={k}", p, (p[:k] + _random_probs(k, vocab, gen, zeros=2)) / 2, k)
    same = _random_probs(k + 1, vocab, gen)
    one = _Case(f"1 of K={k} drafts", _random_probs(k + 1, vocab, gen), _random_probs(k, vocab, gen), 1)
    one.p[2:] = torch.eye(vocab)[0]  # rows past the bonus row and past the draft: ignored, they would draw token 0
    one.q[1:] = torch.eye(vocab)[0]
    none = _Case(f"no drafts, K={k}", _random_probs(k + 1, vocab, gen), _random_probs(k, vocab, gen), 0)
    return [disjoint, mixed, _Case(f"q = p, K={k}", same, same[:k].clone(), k), one, none]


def _acceptance_theory(case: _Case) -> torch.Tensor:  # (num_drafts + 1,) float64: P(k drafts accepted)
    p = case.p.double() / case.p.double().sum(-1, keepdim=True)
    q = case.q.double() / case.q.double().sum(-1, keepdim=True)
    n = case.num_drafts
    alpha = torch.minimum(p[:n], q[:n]).sum(-1).clamp(max=1.0)  # (n,); q = p: exactly 1
    reach = torch.cat([torch.ones(1, dtype=torch.float64), alpha.cumprod(0)])  # P(at least k accepted)
    return reach - torch.cat([reach[1:], torch.zeros(1, dtype=torch.float64)])


def _draw(fn: Callable, cases: list[_Case], draws: int, device: str, gen: torch.Generator):
    """One call of `fn` on `draws` rows per case: the inputs (CPU) and its output (CPU)."""
    p = torch.cat([c.p.expand(draws, -1, -1) for c in cases])  # (B, K+1, V)
    q = torch.cat([c.q.expand(draws, -1, -1) for c in cases])  # (B, K, V)
    n = torch.cat([torch.full((draws,), c.num_drafts) for c in cases])  # (B,)
    batch, k = q.shape[0], q.shape[1]
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=gen)
    positions = torch.randint(0, 2**33, (batch,), generator=gen)
    ones = torch.ones(batch)
    drafts = torch.stack([gumbel_sample_reference(q[:, j].log(), ones, seeds, positions + j)[0] for j in range(k)],
                         dim=1) if k else torch.zeros(batch, 0, dtype=torch.int64)
    drafts = torch.where(torch.arange(k) < n[:, None], drafts, -1)  # entries past num_drafts: ignored
    inputs = (p.contiguous(), q.contiguous(), drafts, n, seeds, positions)
    out = fn(*(t.to(device) for t in inputs))
    return inputs, out.cpu() if isinstance(out, torch.Tensor) else out


def _layout_failures(name: str, out, drafts: torch.Tensor, n: torch.Tensor, vocab: int) -> list[str]:
    batch, k = drafts.shape
    if not isinstance(out, torch.Tensor) or out.shape != (batch, k + 1) or out.dtype != torch.int64:
        got = f"{out.dtype}{list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        return [f"{name}: output {got}, expected int64[{batch}, {k + 1}]"]
    emitted = (out >= 0).long().cumprod(dim=1).sum(dim=1)  # (B,) the leading tokens
    col = torch.arange(k + 1)
    bad = {
        "a value other than -1 after the first -1": (torch.where(col < emitted[:, None], out, -1) != out).any(1),
        "no token emitted": emitted == 0,
        "more than num_drafts + 1 tokens": emitted > n + 1,
        "a token >= the vocabulary size": (out >= vocab).any(1),
        "an emitted token before the last that is not the row's draft": (
            (col[:k] < emitted[:, None] - 1) & (out[:, :k] != drafts)).any(1),
    }
    return [f"{name}: {what} in {int(rows.sum())} of {batch} rows (first: row {int(rows.nonzero()[0])}: "
            f"{out[int(rows.nonzero()[0])].tolist()})" for what, rows in bad.items() if rows.any()]


def _tests(case: _Case, out: torch.Tensor) -> list[tuple[str, str, torch.Tensor, torch.Tensor]]:
    """(what, what a bin is, observed counts, expected probabilities) of one case's rows."""
    vocab, n = case.p.shape[1], case.num_drafts
    accepted = ((out >= 0).long().cumprod(dim=1).sum(dim=1) - 1).clamp(0, n)  # (rows,)
    tests = [(f"{case.name}: the number of drafts accepted", "drafts accepted =",
              torch.bincount(accepted, minlength=n + 1)[:n + 1], _acceptance_theory(case))]
    if n:
        alpha0 = 1 - float(_acceptance_theory(case)[0])
        tests.append((f"{case.name}: the first draft's acceptance rate (theory {alpha0:.4f})", "first accepted =",
                      torch.stack([(accepted == 0).sum(), (accepted > 0).sum()]),
                      torch.tensor([1 - alpha0, alpha0], dtype=torch.float64)))
    for j in range(n + 1):
        reached = out[accepted >= j, j]
        if len(reached) >= 10 * vocab:  # (a position the theory says is rare, or never reached: the count test's)
            tests.append((f"{case.name}: the token at position {j} of the {len(reached)} rows reaching it", "token",
                          torch.bincount(reached, minlength=vocab), case.p[j].double()))
    return tests


def check_rejection_sampler(fn: Callable, device: str = "cpu", draws: int = 4000, vocab: int = 8,
                            alpha: float = 1e-5, seed: int = 0) -> list[str]:
    """Failures of `fn` (rejection_sample_reference's signature) on the synthetic cases (module doc); [] = pass.
    `draws` rows per case; `alpha` the family-wise false-alarm rate of the distributional tests."""
    gen = torch.Generator().manual_seed(seed)
    failures, tests = [], []
    for k in (1, 3):
        cases = _cases(k, vocab, gen)
        (p, q, drafts, n, _, _), out = _draw(fn, cases, draws, device, gen)
        layout = _layout_failures(f"K={k}", out, drafts, n, vocab)
        failures += layout
        if not layout:
            for i, case in enumerate(cases):
                tests += _tests(case, out[i * draws:(i + 1) * draws])
    for what, outcome, counts, probs in tests:
        result = g_test(counts, probs)
        if result.impossible or not result.p_value > alpha / len(tests):
            failures.append(f"{what}: {_describe(result, outcome)} (the threshold {alpha / len(tests):.1e})")
    return failures


def _describe(result: GTest, outcome: str) -> str:
    off = ", ".join(f"{'the pooled tail' if t < 0 else f'{outcome} {t}'}: {o} observed vs {e:.1f} expected"
                    for t, o, e in result.worst)
    never = "; observed though of probability 0: " + ", ".join(f"{outcome} {t} ({c} times)"
                                                                for t, c in result.impossible.items())
    return f"G-test p = {result.p_value:.2e} over {result.num_bins} bins ({off}){never if result.impossible else ''}"
