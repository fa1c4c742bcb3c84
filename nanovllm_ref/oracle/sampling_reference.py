"""The sampling reference: transformers' logits processors on transformers' logits, and a goodness-of-fit test.

`ReferenceSampler`, `process` and `eos_ids` are golden.hf_sampling's (the goldens are recorded with them; see
there): the processed distribution of the next token for a request with vLLM-named params, by transformers' own
processors in its order, with the OpenAI / vLLM presence and frequency penalties.
`g_test` compares observed token counts with it: bins of expected count >= 5 each, the rest pooled in one tail
bin, G = 2 sum O ln(O/E) against chi-square(bins - 1); tokens the reference gives probability 0 are reported
apart (any such draw is a failure). References: Sokal & Rohlf, Biometry (the G-test of goodness of fit).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from golden.hf_sampling import ReferenceSampler, eos_ids, process

__all__ = ["GTest", "ReferenceSampler", "eos_ids", "g_test", "process"]


@dataclass
class GTest:
    p_value: float
    num_bins: int
    impossible: dict[int, int]  # token -> draws of tokens the reference excludes
    worst: list[tuple[int, int, float]]  # (token or -1 for the pooled tail, observed, expected), most off first

    def describe(self) -> str:
        off = ", ".join(f"{'tail' if t < 0 else f'token {t}'}: {o} drawn vs {e:.1f} expected" for t, o, e in self.worst)
        bad = f"; tokens the reference excludes drawn: {self.impossible}" if self.impossible else ""
        return f"G-test p = {self.p_value:.2e} over {self.num_bins} bins ({off}){bad}"


def g_test(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> GTest:
    """Goodness of fit of `counts` (vocab,) draws to `probs` (vocab,), with pooled tail bins (see module doc)."""
    counts, probs = counts.double(), probs.double()
    total = float(counts.sum())
    impossible = {int(t): int(counts[t]) for t in torch.nonzero((probs == 0) & (counts > 0)).flatten()}
    expected = probs / probs.sum() * total
    big = torch.nonzero(expected >= min_expected).flatten()
    tail = torch.ones_like(expected, dtype=torch.bool)
    tail[big] = False
    obs = torch.cat([counts[big], counts[tail].sum()[None]])
    exp = torch.cat([expected[big], expected[tail].sum()[None]])
    tokens = big.tolist() + [-1]
    if exp[-1] < min_expected and len(obs) > 1:  # a small tail joins the smallest bin
        j = int(torch.argmin(exp[:-1]))
        obs[j] += obs[-1]
        exp[j] += exp[-1]
        obs, exp, tokens = obs[:-1], exp[:-1], tokens[:-1]
    if len(obs) < 2:
        return GTest(1.0, len(obs), impossible, [])
    g = 2 * float(torch.where(obs > 0, obs * torch.log(obs / exp), torch.zeros_like(obs)).sum())
    p = float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2, dtype=torch.float64),
                                      torch.tensor(g / 2, dtype=torch.float64)))
    z = ((obs - exp) / exp.sqrt()).abs()
    worst = [(tokens[i], int(obs[i]), float(exp[i])) for i in torch.argsort(z, descending=True)[:4].tolist()]
    return GTest(p, len(obs), impossible, worst)
