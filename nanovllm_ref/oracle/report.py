"""Verdicts of the conformance comparison: one :class:`PromptReport` per prompt, gathered in a
:class:`ConformanceReport` with a pandas summary table and a JSON form (see :mod:`nanovllm_ref.oracle.compare`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

MATCH, DIVERGED_OK, FAIL = "match", "diverged-ok", "fail"
LOGPROBS, TOKENS_ONLY = "logprobs", "tokens-only"  # the policy's modes (compare.py)


@dataclass
class PromptReport:
    """The verdict for one prompt. ``max_abs_diff`` is the largest |logprob difference| over all shared tokens
    of all compared positions (generated and prompt), found at ``where``."""

    prompt_id: str
    status: str  # "match" | "diverged-ok" | "fail"
    num_tokens: int  # generated tokens in the reference
    matched_tokens: int  # leading generated tokens that are equal
    first_divergence: int | None
    max_abs_diff: float
    where: str
    max_gen_diff: float
    max_prompt_diff: float
    message: str
    failures: list[str] = field(default_factory=list)
    model: str = ""
    dtype: str = ""
    engine: str = ""
    case: str = ""
    mode: str = LOGPROBS  # "tokens-only" for an engine without logprobs
    gen_diff_sum: float = 0.0  # sum and count of |dlogprob| over the shared generated-step logprobs (set mean)
    gen_diff_count: int = 0

    @property
    def passed(self) -> bool:
        return self.status != FAIL


@dataclass
class ConformanceReport:
    """Per-prompt verdicts of one or more comparisons, plus free-form metadata (tolerances, engine...)."""

    prompts: list[PromptReport] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # failures of a whole golden set (its mean |dlogprob|, compare_all): model, dtype, engine, case, mean, mean_tol,
    # message
    set_failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(p.passed for p in self.prompts) and not self.set_failures

    def failures(self) -> list[PromptReport]:
        return [p for p in self.prompts if not p.passed]

    def extend(self, other: ConformanceReport) -> ConformanceReport:
        self.prompts.extend(other.prompts)
        self.set_failures.extend(other.set_failures)
        return self

    def format_failures(self, limit: int = 10) -> str:
        """The failure messages, one per line (at most ``limit`` prompts, each with its first 3 problems)."""
        lines = [f"{'/'.join(x for x in (f['model'], f['dtype'], f['case']) if x)}: FAIL (whole set): {f['message']}"
                 for f in self.set_failures]
        for p in self.failures()[:limit]:
            ctx = "/".join(x for x in (p.model, p.dtype, p.case) if x)
            lines.append(f"{ctx}: {p.message}" if ctx else p.message)
            lines += [f"    - {f}" for f in p.failures[:3]]
        more = len(self.failures()) - limit
        if more > 0:
            lines.append(f"... and {more} more failing prompts")
        return "\n".join(lines) or "all prompts passed"

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "meta": self.meta, "prompts": [asdict(p) for p in self.prompts],
                "set_failures": self.set_failures}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConformanceReport:
        """The inverse of :meth:`to_dict` (how pytest-xdist workers hand their reports to the controller)."""
        return cls([PromptReport(**p) for p in d["prompts"]], d.get("meta", {}), list(d.get("set_failures", [])))

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def summary_table(self, per: str = "prompt") -> Any:
        """A pandas DataFrame: one row per prompt (``per="prompt"``) or per (model, dtype, engine, case)
        (``per="model"``) with status, matched tokens, max |dlogprob| and where it was (per model also the mean
        |dlogprob| over the set's shared generated-step logprobs, what ``mean_tol`` bounds)."""
        import pandas as pd

        rows = [{
            "model": p.model, "dtype": p.dtype, "engine": p.engine, "case": p.case, "mode": p.mode,
            "prompt": p.prompt_id,
            "status": p.status, "matched": f"{p.matched_tokens}/{p.num_tokens}",
            "first_div": p.first_divergence, "max_dlogprob": p.max_abs_diff, "where": p.where,
            "_sum": p.gen_diff_sum, "_count": p.gen_diff_count,
        } for p in self.prompts]
        df = pd.DataFrame(rows, columns=["model", "dtype", "engine", "case", "mode", "prompt", "status", "matched",
                                         "first_div", "max_dlogprob", "where", "_sum", "_count"])
        df["first_div"] = df["first_div"].astype("Int64")
        if per == "prompt" or df.empty:
            return df.drop(columns=["_sum", "_count"])
        if per != "model":
            raise ValueError(f"per must be 'prompt' or 'model', got {per!r}")
        out = []
        for key, g in df.groupby(["model", "dtype", "engine", "case", "mode"], sort=False):
            worst = g["max_dlogprob"].idxmax()
            where = f"{g.loc[worst, 'prompt']}: {g.loc[worst, 'where']}" if g.loc[worst, "where"] else "-"
            counts = g["status"].value_counts()
            out.append({**dict(zip(["model", "dtype", "engine", "case", "mode"], key)), "prompts": len(g),
                        "match": int(counts.get(MATCH, 0)), "diverged_ok": int(counts.get(DIVERGED_OK, 0)),
                        "fail": int(counts.get(FAIL, 0)), "max_dlogprob": g.loc[worst, "max_dlogprob"],
                        "mean_dlogprob": g["_sum"].sum() / g["_count"].sum() if g["_count"].sum() else None,
                        "where": where})
        return pd.DataFrame(out)
