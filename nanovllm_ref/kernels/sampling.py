"""Gumbel-max sampling with counter-based noise: token = argmax(logits / T + g), g ~ Gumbel(0, 1).

The noise of vocabulary entry v for a row is a hash of (row_key, v), where row_key = hash(hash(seed), counter)
(PCG's output permutation, O'Neill 2014): no generator state, so a request's draw depends only on its seed,
the token position and its own logits. Rows with temperature 0 take the plain argmax (first index on ties,
as torch.argmax). Both return the tokens and, in the same (2, n) tensor, whether each row's logits are all
finite (the engine reports a NaN/inf row as an error): one tensor to copy to the host. The Triton version is
two launches: a split argmax that fuses the row keys, the hash, the noise and the scaling into one pass over
the logits (memory bound: one read; greedy rows skip the noise), then a pick of the best split per row; the
torch reference materialises ~20 full-size temporaries.
"""

from __future__ import annotations

import torch

from ._triton_common import tl, triton

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

    # the per-row parameters are row views of one packed tensor: their alignment changes with the batch size,
    # which must not select a new compiled variant mid-run
    @triton.jit(do_not_specialize=["temp_ptr", "seeds_ptr", "counters_ptr"])
    def _gumbel_argmax_kernel(
        logits_ptr, temp_ptr, seeds_ptr, counters_ptr, part_val_ptr, part_idx_ptr, part_finite_ptr,
        vocab, stride_row, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    ):
        """Stage 1: the best (score, index) and the all-finite flag of one CHUNK of one row."""
        row = tl.program_id(0)
        split = tl.program_id(1)
        temp = tl.load(temp_ptr + row)
        inv_t = 1.0 / tl.where(temp > 0, temp, 1.0)
        seed = tl.load(seeds_ptr + row)
        # row_keys: int64 -> uint32 casts truncate, i.e. the reference's & 0xFFFFFFFF
        key = _pcg(_pcg((seed ^ (seed >> 32)).to(tl.uint32)) + tl.load(counters_ptr + row).to(tl.uint32))
        # per-lane running best (a cross-lane reduction per block would cost a shared-memory round trip each);
        # strict > keeps each lane's earliest index, so the final pick below is the chunk's first maximum
        best_val = tl.full((BLOCK,), float("-inf"), tl.float32)
        best_idx = tl.full((BLOCK,), 2147483647, tl.int32)
        finite = tl.full((BLOCK,), 1, tl.int1)
        for start in range(split * CHUNK, split * CHUNK + CHUNK, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offs, mask=mask, other=0.0).to(tl.float32)
            finite &= (x == x) & (tl.abs(x) < float("inf"))
            if temp > 0:  # greedy rows skip the two logs per entry
                u = ((_pcg(key + offs.to(tl.uint32)) >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
                score = x * inv_t - tl.log(-tl.log(u))
            else:
                score = x
            better = mask & (score > best_val)
            best_idx = tl.where(better, offs, best_idx)
            best_val = tl.where(better, score, best_val)
        top = tl.max(best_val, axis=0)
        first = tl.min(tl.where(best_val == top, best_idx, 2147483647), axis=0)
        all_finite = tl.min(finite.to(tl.int32), axis=0)
        at = row * tl.num_programs(1) + split
        tl.store(part_val_ptr + at, top)
        tl.store(part_idx_ptr + at, first)
        tl.store(part_finite_ptr + at, all_finite)

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
            CHUNK=chunk, BLOCK=block,
        )
        _pick_split_kernel[(n,)](part_val, part_idx, part_finite, out, n, splits,
                                 BLOCK_S=triton.next_power_of_2(splits))
    return out
