"""Speculative decoding's settings: `LLM(model, speculative_config={...})` with vLLM's names.

Two proposers (engine/proposers.py): `method="ngram"` (prompt lookup: the tokens that followed the latest earlier
occurrence of the sequence's last n tokens, n from `prompt_lookup_max` down to `prompt_lookup_min`), and a draft
model (`model=` another checkpoint folder with the same tokenizer; `method="draft_model"`, implied by `model`). Each
step a decoding sequence gets up to `num_speculative_tokens` proposals, verified in one target forward; the rejection
rule (kernels/rejection.py; engine/verify.py) keeps the target's distribution exactly. References: vLLM
vllm/config/speculative.py (the names), Leviathan et al. 2023 and Chen et al. 2023 (the rule), Saxena 2023 (prompt
lookup decoding).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .sampling_params import check_int

METHODS = ("ngram", "draft_model")
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str | None = None  # None: "draft_model" when `model` is given, else "ngram"
    num_speculative_tokens: int = 3
    # ngram: the shortest and longest suffix matched; one given: both are it; neither: 5 (vLLM's defaults)
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None  # draft_model: its checkpoint folder

    def __post_init__(self) -> None:
        method = self.method or ("draft_model" if self.model is not None else "ngram")
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {METHODS}, got {self.method!r}")
        object.__setattr__(self, "method", method)
        check_int("speculative_config.num_speculative_tokens", self.num_speculative_tokens, 1,
                  MAX_SPECULATIVE_TOKENS)
        if method == "ngram":
            self._resolve_lookup()
            if self.model is not None:
                raise ValueError("speculative_config.model is for method 'draft_model', not 'ngram'")
        elif not isinstance(self.model, (str, os.PathLike)) or not os.path.isdir(self.model):
            raise ValueError(f"speculative_config.model must be a local checkpoint folder, got {self.model!r}")

    def _resolve_lookup(self) -> None:
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        low = low if low is not None else (5 if high is None else high)
        high = high if high is not None else low
        check_int("speculative_config.prompt_lookup_min", low, 1, 64)
        check_int("speculative_config.prompt_lookup_max", high, 1, 64)
        if low > high:
            raise ValueError(f"speculative_config.prompt_lookup_min ({low}) must be <= prompt_lookup_max ({high})")
        object.__setattr__(self, "prompt_lookup_min", low)
        object.__setattr__(self, "prompt_lookup_max", high)

    @classmethod
    def from_value(cls, value: Any) -> SpeculativeConfig | None:
        """A SpeculativeConfig from one, a dict of its fields (unknown keys refused by name), or None."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict of vLLM's fields, got {type(value).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; valid keys: {sorted(known)}")
        return cls(**value)
