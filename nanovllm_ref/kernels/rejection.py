"""Speculative decoding's rejection sampler: accept draft tokens with probability min(1, p/q), then emit one token.

For sequence b and j = 0 .. num_drafts[b] - 1, draft d_j (drawn by the draft model from q_j) is accepted iff
u_j * q_j(d_j) < p_j(d_j), u_j ~ U(0, 1): acceptance probability min(1, p_j(d_j) / q_j(d_j)); p(d) = 0 is never
accepted. At the first rejection a token is drawn from norm(max(0, p_j - q_j)) and the row stops; if every draft
is accepted a bonus token is drawn from p_{num_drafts}. Each emitted token is then distributed as p at its
position (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Theorem 1; Chen et
al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"; vLLM's
v1/sample/rejection_sampler.py). A residual that is zero everywhere (p <= q by rounding) falls back to p.

The randomness is counter-based, as kernels/sampling.py's: keyed by (seed, position of the token being decided),
with no generator state, in three streams of 32-bit keys. With key(s, t) = `row_keys(s, t)` (the plain sampler's):
* acceptance of the token at position t: u = uniform_from_bits(pcg(pcg(key(s, t) ^ ACCEPT_SALT)) >> 9);
* the recovered token at t: Gumbel-max over log(residual) with the noise of `uniform_noise(k, V)` at
  k = pcg(key(s, t) ^ RECOVER_SALT);
* the bonus token at t = positions[b] + num_drafts[b]: Gumbel-max over log(p) with the plain sampler's own noise,
  `uniform_noise(key(s, t), V)`: the bonus is the token `gumbel_sample_reference(log p, 1, s, t)` draws, and a
  draft model that samples with the plain sampler and q = p has every draft accepted, so the emitted tokens are
  those of decoding without speculation.
Tokens with weight 0 score log 0 = -inf and are never drawn.

The Triton version runs ROWS sequences per program (one for a large vocabulary on the GPU; a tile of many rows
for a small one, and in the interpreter, which runs programs one after another), loops over the drafts, then
passes twice over the emitted row's vocabulary in blocks: whether the residual has mass, then the Gumbel-max, in
log2 units with sampling.py's noise (`_neg_log_uniform`, the GPU's one-instruction log2): its tokens are the
reference's up to the float rounding of the scores.
"""

from __future__ import annotations

import torch

from ._triton_common import tl, triton, upcast_dots
from .sampling import pcg_hash, row_keys, uniform_noise

ACCEPT_SALT = 0x2545F491  # below 2^31: the same constant in int64 torch and uint32 Triton arithmetic
RECOVER_SALT = 0x1B873593


def stream_keys(seeds: torch.Tensor, counters: torch.Tensor, salt: int) -> torch.Tensor:
    """(n,) keys of a noise stream other than the plain sampler's: its row key, salted and hashed again."""
    return pcg_hash(row_keys(seeds, counters) ^ salt)


def _gumbel_max(weights: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:  # (n, V) >= 0, (n,) -> (n,)
    """argmax(log w + g), g the Gumbel noise of `keys`: gumbel_sample_reference's arithmetic at temperature 1."""
    noise = -torch.log(-torch.log(uniform_noise(keys, weights.shape[1])))
    return (torch.log(weights) + noise).argmax(dim=-1)


def rejection_sample_reference(
    target_probs: torch.Tensor,  # (B, K+1, V) float32: p at each verify position; rows past num_drafts ignored
    draft_probs: torch.Tensor,  # (B, K, V) float32: the q each draft token was drawn from
    draft_tokens: torch.Tensor,  # (B, K) int64; entries past num_drafts are ignored (may be -1)
    num_drafts: torch.Tensor,  # (B,) int64 in [0, K]
    seeds: torch.Tensor,  # (B,) int64
    positions: torch.Tensor,  # (B,) int64: the position of the token row 0 decides
) -> torch.Tensor:  # (B, K+1) int64: the accepted drafts, one recovered or bonus token, then -1
    batch, k1, vocab = target_probs.shape
    k = k1 - 1
    p, q = target_probs.float(), draft_probs.float()
    rows = torch.arange(batch, device=p.device)
    j = torch.arange(k, device=p.device)
    live = j[None, :] < num_drafts[:, None]  # (B, K)
    drafts = torch.where(live, draft_tokens, 0)  # ignored entries may be -1: a safe index
    u = uniform_noise(stream_keys(seeds[:, None].expand(-1, k).flatten(), (positions[:, None] + j).flatten(),
                                  ACCEPT_SALT), 1).view(batch, k)  # (B, K)
    p_d = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # (B, K) p_j(d_j)
    q_d = q.gather(-1, drafts[..., None]).squeeze(-1)
    accept = (u * q_d < p_d) & live
    n_acc = accept.long().cumprod(dim=1).sum(dim=1)  # (B,) drafts accepted before the first rejection
    rejected = n_acc < num_drafts
    p_last = p[rows, n_acc]  # (B, V) the emitted token's target row
    q_last = q[rows, n_acc.clamp(max=k - 1)] if k else torch.zeros_like(p_last)  # (read only where rejected)
    residual = (p_last - q_last).clamp(min=0)
    weights = torch.where((rejected & (residual > 0).any(dim=-1))[:, None], residual, p_last)
    bonus_keys = row_keys(seeds, positions + n_acc)  # the plain sampler's noise at the bonus token's position
    recover_keys = stream_keys(seeds, positions + n_acc, RECOVER_SALT)
    token = _gumbel_max(weights, torch.where(rejected, recover_keys, bonus_keys))
    out = torch.cat([torch.where(j[None, :] < n_acc[:, None], draft_tokens, -1),
                     torch.full((batch, 1), -1, dtype=torch.int64, device=p.device)], dim=1)  # (B, K+1)
    out[rows, n_acc] = token
    return out


if triton is not None:
    from .sampling import _log2, _neg_log_uniform, _pcg

    _ACCEPT = tl.constexpr(ACCEPT_SALT)
    _RECOVER = tl.constexpr(RECOVER_SALT)

    @triton.jit
    def _accept_drafts(p_rows, q_rows, tokens_ptr, rows64, live, n, seed_key, pos, K, vocab, ROWS: tl.constexpr):
        """(ROWS,) the drafts each row accepts before its first rejection."""
        accepted = tl.zeros((ROWS,), tl.int64)
        going = live  # every draft so far accepted
        for j in range(0, K):
            going = going & (j < n)
            d = tl.load(tokens_ptr + rows64 * K + j, mask=going, other=0)
            p_tok = tl.load(p_rows + j * vocab + d, mask=going, other=0.0)
            q_tok = tl.load(q_rows + j * vocab + d, mask=going, other=0.0)
            key = _pcg(seed_key + (pos + j).to(tl.uint32))  # row_keys(seed, position of d_j)
            u = ((_pcg(_pcg(key ^ _ACCEPT)) >> 9).to(tl.int32).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
            going = going & (u * q_tok < p_tok)
            accepted += going.to(tl.int64)
        return accepted

    @triton.jit
    def _residual_has_mass(p_last, q_last, rejected, vocab, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        """(ROWS,) whether max(0, p - q) is positive somewhere (rows not rejected: False)."""
        top = tl.zeros((ROWS,), tl.float32)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = rejected[:, None] & (offs < vocab)[None, :]
            p = tl.load(p_last[:, None] + offs[None, :], mask=m, other=0.0)
            q = tl.load(q_last[:, None] + offs[None, :], mask=m, other=0.0)
            top = tl.maximum(top, tl.max(p - q, axis=1))
        return top > 0

    @triton.jit
    def _gumbel_max_rows(p_last, q_last, key, live, residual, vocab, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                         FAST: tl.constexpr):
        """(ROWS,) argmax over the vocabulary of log2(w) - log2(E), E = -ln(u) (= log2(e) (ln w + g)), with
        w = max(0, p - q) on residual rows and p on the others (their q is not loaded: 0)."""
        best_val = tl.full((ROWS, BLOCK), float("-inf"), tl.float32)  # per-lane running best, as sampling.py
        best_idx = tl.full((ROWS, BLOCK), 2147483647, tl.int32)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            inb = (offs < vocab)[None, :]
            p = tl.load(p_last[:, None] + offs[None, :], mask=live[:, None] & inb, other=0.0)
            q = tl.load(q_last[:, None] + offs[None, :], mask=residual[:, None] & inb, other=0.0)
            w = tl.maximum(p - q, 0.0)  # (ROWS, BLOCK); 0 past the vocabulary
            bits = (_pcg(key[:, None] + offs[None, :].to(tl.uint32)) >> 9).to(tl.int32)
            # log 0 = -inf (never drawn), without evaluating log2(0) (the interpreter's numpy warns)
            log_w = tl.where(w > 0, _log2(tl.where(w > 0, w, 1.0), FAST), float("-inf"))
            score = log_w - _log2(_neg_log_uniform(bits, FAST), FAST)
            better = score > best_val  # strict: each lane keeps its earliest index
            best_val = tl.where(better, score, best_val)
            best_idx = tl.where(better, offs[None, :], best_idx)
        top = tl.max(best_val, axis=1)
        first = tl.min(tl.where(best_val == top[:, None], best_idx, 2147483647), axis=1)  # torch.argmax's tie rule
        return tl.where(top > float("-inf"), first, 0).to(tl.int64)  # all -inf: index 0, as torch.argmax

    @triton.jit(do_not_specialize=["batch"])  # the batch size changes every step: one compiled variant
    def _rejection_kernel(target_ptr, draft_ptr, tokens_ptr, num_drafts_ptr, seeds_ptr, positions_ptr, out_ptr,
                          batch, K, vocab, ROWS: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
        live = rows < batch
        rows64 = rows.to(tl.int64)
        n = tl.load(num_drafts_ptr + rows, mask=live, other=0)
        seed = tl.load(seeds_ptr + rows, mask=live, other=0)
        pos = tl.load(positions_ptr + rows, mask=live, other=0)
        seed_key = _pcg((seed ^ (seed >> 32)).to(tl.uint32))  # row_keys' first hash (int64 -> uint32 truncates)
        p_rows = target_ptr + rows64 * ((K + 1) * vocab)  # each row's (K+1, V) block
        q_rows = draft_ptr + rows64 * (K * vocab)
        accepted = _accept_drafts(p_rows, q_rows, tokens_ptr, rows64, live, n, seed_key, pos, K, vocab, ROWS)
        rejected = live & (accepted < n)
        p_last = p_rows + accepted * vocab  # the emitted token's rows (q's only read where rejected: < K)
        q_last = q_rows + accepted * vocab
        residual = rejected & _residual_has_mass(p_last, q_last, rejected, vocab, ROWS, BLOCK)
        plain = _pcg(seed_key + (pos + accepted).to(tl.uint32))  # the plain sampler's key at the token's position
        key = tl.where(rejected, _pcg(plain ^ _RECOVER), plain)
        token = _gumbel_max_rows(p_last, q_last, key, live, residual, vocab, ROWS, BLOCK, FAST)
        for j in range(0, K + 1):  # each column written once: the accepted drafts, the token, then -1
            d = tl.load(tokens_ptr + rows64 * K + j, mask=live & (j < accepted), other=-1)
            tl.store(out_ptr + rows64 * (K + 1) + j, tl.where(j == accepted, token, d), mask=live)


def rejection_sample(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                     num_drafts: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, *,
                     rows_per_program: int | None = None) -> torch.Tensor:
    """Triton version of `rejection_sample_reference` (the same tokens up to float rounding of the scores): one
    launch, no host sync. `rows_per_program` (a power of two) overrides the rows each program takes (tests)."""
    batch, k1, vocab = target_probs.shape
    out = torch.empty(batch, k1, dtype=torch.int64, device=target_probs.device)
    if batch == 0:
        return out
    block = min(1024, triton.next_power_of_2(vocab))
    interpreted = upcast_dots(target_probs.device)
    # tiles of <= 1024 entries on the GPU (one row per program for large vocabularies); the interpreter runs its
    # programs one after another at ~50 ms each, so there a program takes up to 64k entries' worth of rows
    tile = 65536 if interpreted else 1024
    rows = rows_per_program or min(triton.next_power_of_2(batch), max(1, tile // block))
    _rejection_kernel[(triton.cdiv(batch, rows),)](
        target_probs.float().contiguous(), draft_probs.float().contiguous(), draft_tokens.contiguous(),
        num_drafts.contiguous(), seeds.contiguous(), positions.contiguous(), out, batch, k1 - 1, vocab,
        ROWS=rows, BLOCK=block, FAST=not interpreted,  # (the interpreter has no libdevice)
    )
    return out
