"""Plain-text and markdown tables (no dependencies), and where benchmark results are written.

Results go where the user says (`--json FILE` or `--out DIR`), else to a user cache folder,
`$XDG_CACHE_HOME/nanovllm_ref/bench` (`~/.cache/nanovllm_ref/bench`; `NANOVLLM_REF_BENCH_DIR` overrides it):
never into the package or a source tree. perf/results/ (ignored by git) holds only the runs a user copies there for
the report.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any


def results_dir() -> str:
    """The default folder of saved benchmark results (created on first save)."""
    if os.environ.get("NANOVLLM_REF_BENCH_DIR"):
        return os.environ["NANOVLLM_REF_BENCH_DIR"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "nanovllm_ref", "bench")


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


def save_result(record: dict[str, Any], path: str | None = None, stem: str = "run", folder: str | None = None) -> str:
    """Write a JSON record to `path`, else to `folder` (default: results_dir()) as <time>_<stem>.json; returns the
    path."""
    if path is None:
        folder = folder or results_dir()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{time.strftime('%Y%m%d-%H%M%S')}_{stem}.json")
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record.setdefault("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S"))
    with open(path, "w") as f:
        json.dump(record, f, indent=2, default=str)
    return path
