"""The rejection sampler's kernel-conformance inputs (testing/kernels.py's "rejection_sample" entry).

Drawn inputs for `rejection_sample_reference`'s signature (kernels/rejection.py): target and draft distributions
whose logits are scaled by the conformance magnitude (x1e-3: near-uniform p and q, the residual a difference of
near-equal numbers; x1e2: near one-hot), excluded tokens (a top-k / top-p mask), rows where q = p (every draft
accepted, the bonus drawn), q close to p, q unrelated; drafts from q and some that p excludes; every num_drafts in
[0, K], the ignored rows poisoned with NaN and the ignored drafts -1; seeds of either sign and positions past 2^32.
The check is exact: the candidate's tokens must be the reference's (nanovllm_ref's kernel differs only by the
float rounding of its scores, which moves a draw only where two scores tie to ~1e-6).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from .mismatch import check_equal


def make_inputs(batch: int, k: int, vocab: int, seed: int, magnitude: float = 1.0, mask: bool = True,
                poison: bool = True, device: str = "cpu") -> tuple:
    """(target_probs, draft_probs, draft_tokens, num_drafts, seeds, positions) of the module doc's mix."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=gen) * 2 * magnitude
    if mask:
        logits[torch.rand(batch, k + 1, vocab, generator=gen) < 0.2] = float("-inf")
        logits[..., 0] = logits[..., 0].nan_to_num(neginf=0.0)  # never a row without a token
    p = logits.softmax(dim=-1)  # (B, K+1, V)
    kind = torch.arange(batch) % 3  # 0: q = p, 1: q close to p, 2: q unrelated
    close = (logits[:, :k] + 0.3 * torch.randn(batch, k, vocab, generator=gen)).softmax(dim=-1)
    other = (torch.randn(batch, k, vocab, generator=gen) * 2 * magnitude).softmax(dim=-1)
    q = torch.where((kind == 0)[:, None, None], p[:, :k], torch.where((kind == 1)[:, None, None], close, other))
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(batch, k) if batch * k else \
        torch.zeros(batch, k, dtype=torch.int64)
    if k:
        drafts[::4, 0] = torch.randint(0, vocab, (len(drafts[::4]),), generator=gen)  # tokens p may exclude
    num_drafts = torch.randint(0, k + 1, (batch,), generator=gen)
    live = torch.arange(k)[None, :] < num_drafts[:, None]  # (B, K)
    drafts = torch.where(live, drafts, -1)
    if poison:  # the rows past num_drafts (the bonus row aside) are ignored: NaN there must not matter
        p = torch.where((torch.arange(k + 1)[None, :] > num_drafts[:, None])[..., None], float("nan"), p)
        q = torch.where(live[..., None], q, float("nan"))
    seeds = torch.randint(1, 2**62, (batch,), generator=gen) * (1 - 2 * (torch.arange(batch) % 2))
    positions = torch.randint(2**32 - 8, 2**33, (batch,), generator=gen)
    return tuple(t.to(device) for t in (p, q, drafts, num_drafts, seeds, positions))


@st.composite
def inputs(draw, size: str, dtypes, magnitude: float, device: str) -> tuple:
    """The conformance draws (`dtypes` unused: the probabilities are float32 by the signature)."""
    small = size == "small"
    batch = draw(st.integers(1, 6 if small else 64))
    k = draw(st.sampled_from([1, 3, 5]))
    vocab = draw(st.sampled_from([6, 50, 1000, 2500] if small else [32000, 151936]))  # none a block multiple
    return make_inputs(batch, k, vocab, draw(st.integers(0, 2**31 - 1)), magnitude, draw(st.booleans()),
                       draw(st.booleans()), device)


def check(out, ref, inputs: tuple) -> None:
    check_equal(out, ref, "the tokens (accepted drafts, the recovered or bonus token, -1)")


def across_programs(device: str) -> tuple:
    """150 rows of a 2,500-token vocabulary: three programs of nanovllm_ref's kernel in the interpreter (64 rows
    each, the last partial), 150 on a GPU, each over three vocabulary blocks (the last partial)."""
    return make_inputs(150, 3, 2500, seed=23, device=device)
