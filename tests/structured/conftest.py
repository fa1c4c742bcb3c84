"""Shared pieces of the structured-output tests: the golden tokenizers of each kind, and a bitmask's allowed ids."""

from __future__ import annotations

import functools

import numpy as np

from golden.load import checkpoint_path

# one golden checkpoint per tokenizer kind (vocab.py): byte-level BPE, byte fallback + Metaspace, WordLevel
KINDS = {"byte-level": "qwen3-tiny", "byte-fallback": "mistral-spm-hd32", "word-level": "qwen3-words-hd32"}
VOCAB = 1536  # every golden checkpoint's config vocab_size


@functools.cache
def tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint_path(name))


def allowed(row: np.ndarray, vocab: int = VOCAB) -> set[int]:
    """The token ids a packed bitmask row (int32 words, token v = bit v % 32 of word v // 32) allows."""
    bits = np.unpackbits(np.ascontiguousarray(row).view(np.uint8), bitorder="little")[:vocab]
    return set(np.flatnonzero(bits).tolist())
