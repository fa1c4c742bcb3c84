"""Gumbel-max sampling with counter-based noise: token = argmax(logits / T + g), g ~ Gumbel(0, 1).

The noise of vocabulary entry v for a row is a hash of (row_key, v), where row_key = hash(hash(seed), counter)
(PCG's output permutation, O'Neill 2014): no generator state, so a request's draw depends only on its seed,
the token position and its own logits. Rows with temperature 0 take the plain argmax (first index on ties,
as torch.argmax). Both return the tokens and, in the same (2, n) tensor, whether each row's logits are all
finite (the engine reports a NaN/inf row as an error): one tensor to copy to the host. The Triton version is
two launches: a split argmax that fuses the row keys, the hash, the noise and the scaling into one pass over
the logits (one read; greedy rows skip the noise), then a pick of the best split per row; the torch reference
materialises ~20 full-size temporaries. The kernel's noise is the reference's up to float32 rounding, but cheap:
arithmetic, not memory, bounds a sampled row (two logarithms per entry), so it scores in log2 units with the
GPU's one-instruction log2, and computes -ln(u) near u = 1 from a short series (`_neg_log_uniform`): 2.1x
faster than two accurate logarithms on the headline's 256 x 151,936 logits (perf/RESULTS.md).
"""

from __future__ import annotations

import torch

from ._triton_common import tl, triton, upcast_dots

if triton is not None:
    from triton.language.extra import libdevice

_M32 = 0xFFFFFFFF


def pcg_hash(x: torch.Tensor) -> torch.Tensor:  # int64 in [0, 2^32) -> int64 in [0, 2^32)
    state = (x * 747796405 + 2891336453) & _M32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _M32
    return ((word >> 22) ^ word) & _M32


def row_keys(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """(n,) int64 keys in [0, 2^32) from int64 seeds and token positions."""
    return pcg_hash((pcg_hash((seeds ^ (seeds >> 32)) & _M32) + counters) & _M32)


def uniform_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:  # (n,) -> (n, vocab) float32 in (0, 1)
    idx = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    # 23 bits: (bits + 0.5) / 2^23 is exact in float32 and at most 1 - 2^-24. (With 24 bits the largest value,
    # 1 - 2^-25, rounds to 1.0: Gumbel noise +inf, a token drawn whatever its logit, once in 2^24 entries.)
    return uniform_from_bits(pcg_hash((keys[:, None] + idx[None, :]) & _M32) >> 9)


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:  # int64 in [0, 2^23) -> float32 in (0, 1)
    return (bits.float() + 0.5) * (1.0 / (1 << 23))


def gumbel_sample_reference(
    logits: torch.Tensor,  # (n, vocab) any float dtype (computed in float32); masked entries are -inf
    temperature: torch.Tensor,  # (n,) float32, 0 = greedy
    seeds: torch.Tensor,  # (n,) int64
    counters: torch.Tensor,  # (n,) int64: the position of the token being sampled
) -> torch.Tensor:  # (2, n) int64: the sampled tokens, and 1 where the row's logits are all finite
    logits = logits.float()
    # a row is finite iff its max and min are (NaN propagates through both): two fast reductions, not a bool copy
    finite = (logits.amax(dim=-1).isfinite() & logits.amin(dim=-1).isfinite()).long()
    greedy = logits.argmax(dim=-1)
    if not bool((temperature > 0).any()):  # all greedy: the noise (20 vocab-sized temporaries) is not needed
        return torch.stack([greedy, finite])
    noise = -torch.log(-torch.log(uniform_noise(row_keys(seeds, counters), logits.shape[1])))  # Gumbel(0, 1)
    scores = logits / torch.where(temperature > 0, temperature, 1.0)[:, None] + noise
    return torch.stack([torch.where(temperature > 0, scores.argmax(dim=-1), greedy), finite])


if triton is not None:

    @triton.jit
    def _pcg(x):  # uint32 -> uint32, wrapping arithmetic as the int64 & 0xFFFFFFFF reference
        state = x * 747796405 + 2891336453
        word = ((state >> ((state >> 28) + 4)) ^ state) * 277803737
        return (word >> 22) ^ word

    @triton.jit
    def _log2(x, FAST: tl.constexpr):
        """log2(x): on the GPU one MUFU op (`lg2.approx`, absolute error ~2^-22), in the interpreter numpy's."""
        if FAST:
            return libdevice.fast_log2f(x)
        else:
            return tl.log2(x)

    @triton.jit
    def _neg_log_uniform(bits, FAST: tl.constexpr):
        """E = -ln(u) ~ Exp(1) for u = (bits + 0.5) / 2^23, to float32 relative accuracy: for u >= 15/16, where
        ln(u) would cancel (and the fast log2's absolute error would swamp a small E), from the series of
        -ln(1 - w) in the exact w = 1 - u (its first omitted term is below 2^-31 relative)."""
        u = (bits.to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        w = ((8388607 - bits).to(tl.float32) + 0.5) * (1.0 / 8388608.0)  # 1 - u, exact
        near = w * (1.0 + w * (0.5 + w * (1.0 / 3.0 + w * (0.25 + w * (0.2 + w * (1.0 / 6.0 + w / 7.0))))))
        return tl.where(w <= 0.0625, near, -0.6931471805599453 * _log2(u, FAST))

    @triton.jit
    def _argmax_block(logits_ptr, start, vocab, key, scale, temp, best_val, best_idx, bad,
                      BLOCK: tl.constexpr, MASKED: tl.constexpr, FAST: tl.constexpr):
        """One BLOCK of a row into the per-lane running best. Scores are in log2 units, x log2(e) / T - log2(E) =
        log2(e) (x / T + g) with g = -ln(E) ~ Gumbel(0, 1): the reference's argmax, with two MUFU logs per entry
        instead of two accurate (libdevice) ones. `bad` turns NaN at a NaN or infinite entry (x * 0)."""
        offs = start + tl.arange(0, BLOCK)
        if MASKED:  # (only a row's last block: the others skip the bound checks)
            x = tl.load(logits_ptr + offs, mask=offs < vocab, other=0.0).to(tl.float32)
        else:
            x = tl.load(logits_ptr + offs).to(tl.float32)
        bad = x * 0.0 + bad
        if temp > 0:  # greedy rows skip the noise
            score = x * scale - _log2(_neg_log_uniform((_pcg(key + offs.to(tl.uint32)) >> 9).to(tl.int32), FAST),
                                      FAST)
        else:
            score = x
        better = score > best_val  # strict: each lane keeps its earliest index
        if MASKED:
            better = better & (offs < vocab)
        return tl.where(better, score, best_val), tl.where(better, offs, best_idx), bad

    # the per-row parameters are row views of one packed tensor: their alignment changes with the batch size,
    # which must not select a new compiled variant mid-run
    @triton.jit(do_not_specialize=["temp_ptr", "seeds_ptr", "counters_ptr"])
    def _gumbel_argmax_kernel(
        logits_ptr, temp_ptr, seeds_ptr, counters_ptr, part_val_ptr, part_idx_ptr, part_finite_ptr,
        vocab, stride_row, CHUNK: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr,
    ):
        """Stage 1: the best (score, index) and the all-finite flag of one CHUNK of one row."""
        row = tl.program_id(0)
        split = tl.program_id(1)
        temp = tl.load(temp_ptr + row)
        scale = 1.4426950408889634 / tl.where(temp > 0, temp, 1.0)  # log2(e) / T
        seed = tl.load(seeds_ptr + row)
        # row_keys: int64 -> uint32 casts truncate, i.e. the reference's & 0xFFFFFFFF
        key = _pcg(_pcg((seed ^ (seed >> 32)).to(tl.uint32)) + tl.load(counters_ptr + row).to(tl.uint32))
        # per-lane running best (a cross-lane reduction per block would cost a shared-memory round trip each)
        best_val = tl.full((BLOCK,), float("-inf"), tl.float32)
        best_idx = tl.full((BLOCK,), 2147483647, tl.int32)
        bad = tl.zeros((BLOCK,), tl.float32)
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row
        begin = split * CHUNK
        end = tl.minimum(begin + CHUNK, vocab)
        full_end = tl.minimum(end, vocab // BLOCK * BLOCK)
        for start in range(begin, full_end, BLOCK):
            best_val, best_idx, bad = _argmax_block(row_ptr, start, vocab, key, scale, temp, best_val, best_idx, bad,
                                                    BLOCK, False, FAST)
        if full_end < end:
            best_val, best_idx, bad = _argmax_block(row_ptr, full_end, vocab, key, scale, temp, best_val, best_idx,
                                                    bad, BLOCK, True, FAST)
        top = tl.max(best_val, axis=0)
        first = tl.min(tl.where(best_val == top, best_idx, 2147483647), axis=0)  # the chunk's first maximum
        at = row * tl.num_programs(1) + split
        tl.store(part_val_ptr + at, top)
        tl.store(part_idx_ptr + at, first)
        tl.store(part_finite_ptr + at, (tl.sum(bad, axis=0) == 0).to(tl.int32))

    @triton.jit(do_not_specialize=["num_rows"])  # the batch size changes every step: one compiled variant
    def _pick_split_kernel(part_val_ptr, part_idx_ptr, part_finite_ptr, out_ptr, num_rows, splits,
                           BLOCK_S: tl.constexpr):
        """Stage 2: per row, the split with the best score (the first on ties: the smallest index)."""
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK_S)
        mask = offs < splits
        val = tl.load(part_val_ptr + row * splits + offs, mask=mask, other=float("-inf"))
        idx = tl.load(part_idx_ptr + row * splits + offs, mask=mask, other=0)
        finite = tl.load(part_finite_ptr + row * splits + offs, mask=mask, other=1)
        _, best = tl.max(val, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(out_ptr + row, tl.sum(tl.where(offs == best, idx, 0), axis=0).to(tl.int64))
        tl.store(out_ptr + num_rows + row, tl.min(finite, axis=0).to(tl.int64))


def gumbel_sample(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                  counters: torch.Tensor) -> torch.Tensor:
    """Triton version of `gumbel_sample_reference` (same tokens up to float rounding of the noise): two launches,
    one read of the logits, no host sync."""
    n, vocab = logits.shape
    block = 1024
    splits = max(1, min(32, triton.cdiv(vocab, 8 * block)))  # enough programs to fill the GPU at small batches
    chunk = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    splits = triton.cdiv(vocab, chunk)
    part_val = torch.empty(n, splits, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(n, splits, dtype=torch.int32, device=logits.device)
    part_finite = torch.empty(n, splits, dtype=torch.int32, device=logits.device)
    out = torch.empty(2, n, dtype=torch.int64, device=logits.device)
    if n:
        _gumbel_argmax_kernel[(n, splits)](
            logits, temperature, seeds, counters, part_val, part_idx, part_finite, vocab, logits.stride(0),
            CHUNK=chunk, BLOCK=block, FAST=not upcast_dots(logits.device),  # (the interpreter has no libdevice)
        )
        _pick_split_kernel[(n,)](part_val, part_idx, part_finite, out, n, splits,
                                 BLOCK_S=triton.next_power_of_2(splits))
    return out
