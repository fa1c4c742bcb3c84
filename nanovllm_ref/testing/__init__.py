"""Test helpers other engines can use: hypothesis strategies for paged-KV batches (see strategies.py)."""

from .strategies import RELATIVE_TOLERANCE, PagedBatch, make_paged_batch, paged_batches, relative_error

__all__ = ["RELATIVE_TOLERANCE", "PagedBatch", "make_paged_batch", "paged_batches", "relative_error"]
