"""Gumbel-max sampling with counter-based noise: token = argmax(logits / T + g), g ~ Gumbel(0, 1).

The noise of vocabulary entry v for a row is a hash of (row_key, v), where row_key = hash(hash(seed), counter)
(PCG's output permutation, O'Neill 2014): no generator state, so a request's draw depends only on its seed,
the token position and its own logits. Rows with temperature 0 take the plain argmax (first index on ties,
as torch.argmax). The Triton kernel fuses the hash, the noise, the scaling and a split argmax into one pass
over the logits (memory bound: one read), where the torch reference materialises ~20 full-size temporaries.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

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
    bits = pcg_hash((keys[:, None] + idx[None, :]) & _M32) >> 8  # 24 bits: exact in float32
    return (bits.float() + 0.5) * (1.0 / (1 << 24))


def gumbel_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:  # (n,) -> (n, vocab) float32
    return -torch.log(-torch.log(uniform_noise(keys, vocab)))


def gumbel_sample_reference(
    logits: torch.Tensor,  # (n, vocab) any float dtype (computed in float32); masked entries are -inf
    temperature: torch.Tensor,  # (n,) float32, 0 = greedy
    keys: torch.Tensor,  # (n,) int64 from row_keys
) -> torch.Tensor:  # (n,) int64
    logits = logits.float()
    scores = logits / torch.where(temperature > 0, temperature, 1.0)[:, None] + gumbel_noise(keys, logits.shape[1])
    return torch.where(temperature > 0, scores.argmax(dim=-1), logits.argmax(dim=-1))


if triton is not None:

    @triton.jit
    def _pcg(x):  # uint32 -> uint32, wrapping arithmetic as the int64 & 0xFFFFFFFF reference
        state = x * 747796405 + 2891336453
        word = ((state >> ((state >> 28) + 4)) ^ state) * 277803737
        return (word >> 22) ^ word

    @triton.jit
    def _gumbel_argmax_kernel(
        logits_ptr, temp_ptr, keys_ptr, part_val_ptr, part_idx_ptr,
        vocab, stride_row, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        split = tl.program_id(1)
        temp = tl.load(temp_ptr + row)
        inv_t = tl.where(temp > 0, 1.0 / tl.where(temp > 0, temp, 1.0), 1.0)
        key = tl.load(keys_ptr + row).to(tl.uint32)
        best_val = tl.full((), float("-inf"), tl.float32)
        best_idx = tl.full((), 2147483647, tl.int32)
        for start in range(split * CHUNK, split * CHUNK + CHUNK, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offs, mask=mask, other=float("-inf"))
            x = x.to(tl.float32)
            bits = _pcg(key + offs.to(tl.uint32)) >> 8
            u = (bits.to(tl.float32) + 0.5) * (1.0 / 16777216.0)
            g = -tl.log(-tl.log(u))
            score = tl.where(temp > 0, x * inv_t + g, x)
            score = tl.where(mask, score, float("-inf"))
            val, idx = tl.max(score, axis=0, return_indices=True, return_indices_tie_break_left=True)
            better = val > best_val  # strictly: on ties the earlier block keeps its (smaller) index
            best_idx = tl.where(better, (start + idx).to(tl.int32), best_idx)
            best_val = tl.where(better, val, best_val)
        tl.store(part_val_ptr + row * tl.num_programs(1) + split, best_val)
        tl.store(part_idx_ptr + row * tl.num_programs(1) + split, best_idx)


def gumbel_sample(logits: torch.Tensor, temperature: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Triton version of `gumbel_sample_reference` (same tokens up to float rounding of the noise)."""
    n, vocab = logits.shape
    block = 1024
    splits = max(1, min(32, triton.cdiv(vocab, 8 * block)))
    chunk = triton.cdiv(triton.cdiv(vocab, splits), block) * block
    splits = triton.cdiv(vocab, chunk)
    part_val = torch.empty(n, splits, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(n, splits, dtype=torch.int32, device=logits.device)
    if n:
        _gumbel_argmax_kernel[(n, splits)](
            logits, temperature, keys, part_val, part_idx, vocab, logits.stride(0), CHUNK=chunk, BLOCK=block,
        )
    best = part_val.argmax(dim=1, keepdim=True)  # first split on ties: the smallest index
    return part_idx.gather(1, best)[:, 0].long()
