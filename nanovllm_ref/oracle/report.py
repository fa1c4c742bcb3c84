"""Verdicts of the conformance comparison: one :class:`PromptReport` per prompt, gathered in a
:class:`ConformanceReport` with summary rows, a JSON form and the end-of-run text (see
:mod:`nanovllm_ref.oracle.compare`). Plain Python only: the summary must print in any environment the suite is
installed into. :func:`summary_lines` groups the rows by (model, dtype) under one heading each and keeps every
line within :data:`WIDTH` columns."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

WIDTH = 120  # the summary's line width (a terminal, a CI log)
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

    def summary_table(self, per: str = "prompt") -> list[dict[str, Any]]:
        """Rows (dicts): one per prompt (``per="prompt"``) or per (model, dtype, engine, case, mode)
        (``per="model"``) with status counts, max |dlogprob| and where it was, and the mean |dlogprob| over the
        set's shared generated-step logprobs (what ``mean_tol`` bounds; None when nothing was compared)."""
        rows = [{"model": p.model, "dtype": p.dtype, "engine": p.engine, "case": p.case, "mode": p.mode,
                 "prompt": p.prompt_id, "status": p.status, "matched": f"{p.matched_tokens}/{p.num_tokens}",
                 "first_div": p.first_divergence, "max_dlogprob": p.max_abs_diff, "where": p.where}
                for p in self.prompts]
        if per == "prompt":
            return rows
        if per != "model":
            raise ValueError(f"per must be 'prompt' or 'model', got {per!r}")
        groups: dict[tuple, list[PromptReport]] = {}
        for p in self.prompts:
            groups.setdefault((p.model, p.dtype, p.engine, p.case, p.mode), []).append(p)
        out = []
        for (model, dtype, engine, case, mode), ps in groups.items():
            worst = max(ps, key=lambda p: p.max_abs_diff)
            count = sum(p.gen_diff_count for p in ps)
            out.append({"model": model, "dtype": dtype, "engine": engine, "case": case, "mode": mode,
                        "prompts": len(ps), "match": sum(p.status == MATCH for p in ps),
                        "diverged_ok": sum(p.status == DIVERGED_OK for p in ps),
                        "fail": sum(p.status == FAIL for p in ps), "max_dlogprob": worst.max_abs_diff,
                        "mean_dlogprob": sum(p.gen_diff_sum for p in ps) / count if count else None,
                        "where": f"{worst.prompt_id}: {worst.where}" if worst.where else "-"})
        return out


SET_COLUMNS = ("case", "mode", "prompts", "match", "diverged_ok", "fail", "max_dlogprob", "mean_dlogprob", "where")
PROMPT_COLUMNS = ("case", "prompt", "status", "matched", "first_div", "max_dlogprob", "where")
HEADERS = {"diverged_ok": "div-ok", "max_dlogprob": "max|dlp|", "mean_dlogprob": "mean|dlp|", "first_div": "1st-div"}


CELL = 32  # the widest a column other than the last may be (a long prompt name is cut, not the table widened)


def _cell(value: Any, limit: int = CELL) -> str:
    text = "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_table(rows: list[dict[str, Any]], columns: tuple[str, ...], indent: str = "  ",
                 width: int = WIDTH) -> list[str]:
    """Rows as aligned text lines within ``width`` columns: the last column is cut (ending in "...") to fit."""
    if rows and all(r.get("mode") == LOGPROBS for r in rows):  # the usual mode goes without saying
        columns = tuple(c for c in columns if c != "mode")
    cells = [[_cell(r.get(c), CELL if i < len(columns) - 1 else width) for i, c in enumerate(columns)] for r in rows]
    header = [HEADERS.get(c, c) for c in columns]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(header)]
    lines = []
    for row in [header] + cells:
        text = indent + "  ".join(v.ljust(w) for v, w in zip(row[:-1], widths[:-1])) + "  " + row[-1]
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    return lines


def summary_lines(report: ConformanceReport, all_prompts: bool = False, width: int = WIDTH) -> list[str]:
    """The end-of-run summary: per (model, dtype, engine) a heading, its sets' rows and its prompts that did not
    match exactly (every prompt with ``all_prompts``), then the failures of whole sets."""
    sets, prompts = report.summary_table("model"), report.summary_table("prompt")
    lines: list[str] = []
    for key in dict.fromkeys((r["model"], r["dtype"], r["engine"]) for r in sets):
        lines.append(f"{key[0]} / {key[1]} / engine {key[2]}"[:width])
        lines += format_table([r for r in sets if (r["model"], r["dtype"], r["engine"]) == key], SET_COLUMNS,
                              width=width)
        shown = [r for r in prompts if (r["model"], r["dtype"], r["engine"]) == key
                 and (all_prompts or r["status"] != MATCH)]
        if shown:
            lines.append("  all prompts:" if all_prompts else "  prompts that did not match exactly (-v shows all):")
            lines += format_table(shown, PROMPT_COLUMNS, indent="    ", width=width)
    for f in report.set_failures:
        text = f"whole set FAILED, {f['model']}/{f['dtype']}/{f['engine']}: {f['message']}"
        lines += [text[i: i + width] for i in range(0, len(text), width)]
    return lines


DETAIL_LINES = 30  # a longer detailed summary becomes one line per checkpoint (-v: the detail; JSON: every prompt)
MAX_FAILURE_LINES = 10


def terminal_summary_lines(report: ConformanceReport, verbose: bool = False, width: int = WIDTH,
                           detail_lines: int = DETAIL_LINES) -> list[str]:
    """What the end of a run prints: the detailed summary (:func:`summary_lines`) when it fits in ``detail_lines``
    or with ``verbose``, else one line per checkpoint and dtype pair and the failing sets, at most
    :data:`MAX_FAILURE_LINES` of them: the JSON report has the rest."""
    detailed = summary_lines(report, all_prompts=verbose, width=width)
    if verbose or len(detailed) <= detail_lines:
        return detailed
    sets = report.summary_table("model")
    by_model: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in sets:
        by_model.setdefault(r["model"].split("@")[0], {}).setdefault(r["dtype"], []).append(r)
    name_w = max((len(m) for m in by_model), default=0)
    lines = ["per checkpoint (-v: every case and prompt; the JSON report: every prompt):"]
    for model, dtypes in by_model.items():
        parts = []
        for dtype, rows in dtypes.items():
            fails = sum(r["fail"] > 0 for r in rows)
            worst = max(r["max_dlogprob"] for r in rows)
            parts.append(f"{dtype}: {len(rows)} sets, {'FAIL ' + str(fails) if fails else 'all pass'}, "
                         f"max|dlp| {worst:.3g}")
        lines.append(f"  {model.ljust(name_w)}  " + "  |  ".join(parts))
    failing = [f"  FAIL {r['model']}/{r['dtype']}/{r['case']}: {r['fail']} of {r['prompts']} prompts, worst "
               f"{r['where']}" for r in sets if r["fail"]]
    failing += [f"  FAIL whole set {f['model']}/{f['dtype']}/{f.get('case', '')}: {f['message']}"
                for f in report.set_failures]
    lines += failing[:MAX_FAILURE_LINES]
    if len(failing) > MAX_FAILURE_LINES:
        lines.append(f"  ... and {len(failing) - MAX_FAILURE_LINES} more failing sets: the JSON report")
    return [line if len(line) <= width else line[: width - 3] + "..." for line in lines]
