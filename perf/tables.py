"""Plain-text and markdown tables (no dependencies), and the results folder bench scripts write to."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

PERF_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(PERF_DIR, "results")
BASELINES_DIR = os.path.join(PERF_DIR, "baselines")
PLOTS_DIR = os.path.join(PERF_DIR, "plots")


def fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}" if abs(value) >= 0.01 or value == 0 else f"{value:.3g}"
    return str(value)


def text_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    numeric = [[isinstance(r.get(c), (int, float)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(row, widths, nums))
            for row, nums in zip(cells, numeric)]
    return "\n".join([line, sep, *body])


def markdown_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "_(no rows)_"
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def save_result(record: dict[str, Any], path: str | None = None, stem: str = "run") -> str:
    """Write a JSON record to `path`, or to perf/results/<time>_<stem>.json; returns the path."""
    if path is None:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        path = os.path.join(RESULTS_DIR, f"{time.strftime('%Y%m%d-%H%M%S')}_{stem}.json")
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record.setdefault("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S"))
    with open(path, "w") as f:
        json.dump(record, f, indent=2, default=str)
    return path


def ceiling_row(test_id: str, info: dict[str, Any]) -> dict[str, Any] | None:
    """One row of the perf suite's closing summary: how close a benchmark came to its ceiling (None: no ceiling).

    Kernels carry `fraction_of_ceiling` (of the measured copy bandwidth or matmul rate, perf/kernel_bench.py);
    engine runs carry `roofline_fraction` (of the workload's memory roofline, perf/roofline.py)."""
    fraction = info.get("fraction_of_ceiling", info.get("roofline_fraction"))
    if fraction is None:
        return None
    rate = next(((info[k], unit) for k, unit in (("gbps", "GB/s"), ("tflops", "TFLOP/s"), ("output_tok_s", "tok/s"))
                 if k in info), (None, ""))
    return {"benchmark": test_id, "case": info.get("case", ""), "us/call": info.get("us_per_call_event"),
            "rate": rate[0], "unit": rate[1], "of ceiling": f"{100 * fraction:.1f}%"}
