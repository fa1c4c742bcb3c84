"""Test helpers other engines can use: hypothesis strategies for paged-KV batches (see strategies.py), and the
engine benchmark behind `nanovllm-ref bench` (bench/).

The strategies are imported on first use, so that `nanovllm_ref.testing.bench` works without hypothesis installed.
"""

from typing import Any

__all__ = ["RELATIVE_TOLERANCE", "PagedBatch", "make_paged_batch", "paged_batches", "relative_error"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
