"""Apply a packed token bitmask to logits in place: a disallowed token's logit becomes -inf (structured outputs).

The bitmask is xgrammar's layout (xgrammar docs, "apply_token_bitmask_inplace"; vLLM's structured output applies the
same): one row of ceil(vocab / 32) int32 words per masked logits row, token v allowed iff bit v % 32 of word v // 32
is set; `rows` says which logits row each bitmask row masks (a step's structured sampling rows among all of them).
Bits past the logits' vocabulary are ignored; a logits row that no bitmask row names is left alone.

The reference unpacks the bits with a shift per bit position; the Triton kernel runs one program per (masked row,
block of BLOCK tokens), loads each token's word (the BLOCK / 32 words of the block, cached) and stores -inf only
where the bit is clear: the allowed logits are neither read nor written.
"""

from __future__ import annotations

import torch

from ._triton_common import tl, triton


def apply_token_bitmask_reference(
    logits: torch.Tensor,  # (n, vocab) any float dtype, modified in place
    bitmask: torch.Tensor,  # (m, ceil(vocab / 32)) int32 (more words are allowed: bits past vocab are ignored)
    rows: torch.Tensor,  # (m,) int64: the logits row each bitmask row masks (distinct)
) -> torch.Tensor:  # logits
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    m, words = bitmask.shape
    allowed = ((bitmask[:, :, None] >> shifts) & 1).reshape(m, words * 32)[:, :vocab].bool()  # (m, vocab)
    logits[rows] = logits[rows].masked_fill(~allowed.to(logits.device), float("-inf"))
    return logits


if triton is not None:

    @triton.jit
    def _token_bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, vocab, logits_stride, bitmask_stride,
                              BLOCK: tl.constexpr):
        i = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < vocab
        row = tl.load(rows_ptr + i)
        words = tl.load(bitmask_ptr + i * bitmask_stride + offs // 32, mask=inside, other=-1)
        blocked = ((words >> (offs % 32)) & 1) == 0
        tl.store(logits_ptr + row * logits_stride + offs, float("-inf"), mask=inside & blocked)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Triton version of `apply_token_bitmask_reference` (same arguments; logits' rows must be contiguous)."""
    if logits.stride(1) != 1:
        raise ValueError("apply_token_bitmask: the logits' vocabulary dimension must be contiguous")
    if bitmask.shape[1] * 32 < logits.shape[1] or bitmask.shape[0] != rows.shape[0]:
        raise ValueError(f"apply_token_bitmask: a bitmask of {tuple(bitmask.shape)} for {rows.shape[0]} rows of "
                         f"{logits.shape[1]} logits")
    if len(rows):
        block = 1024
        bitmask = bitmask.contiguous()
        _token_bitmask_kernel[(len(rows), triton.cdiv(logits.shape[1], block))](
            logits, bitmask, rows.contiguous(), logits.shape[1], logits.stride(0), bitmask.stride(0), BLOCK=block)
    return logits
