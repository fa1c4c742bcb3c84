"""Performance suite of nanovllm_ref: kernel and engine benchmarks, peers, profiles, regression gates, report.

Entry points: `nanovllm-ref bench` (the engine benchmark, shipped in nanovllm_ref/testing/bench), `python -m
perf.plans PLAN` (named plans for a GPU machine), `python -m perf.peers` (transformers, vLLM, SGLang on the same
workload), `pytest perf` (pytest-benchmark suites and the gates), `python -m perf.report` (markdown and plots).
See perf/README.md; the current figures are in perf/RESULTS.md.

Here: the suite's folders, and the closing summary row of a benchmark (its fraction of the ceiling). Tables and
result files come from the package (nanovllm_ref/testing/bench/tables.py), which `nanovllm-ref bench` uses from an
install. perf/results/ (ignored by git) is where runs are copied for the report and its plots (perf/plots/, ignored
too); the gates' saved runs are in perf/baselines/.
"""

from __future__ import annotations

import os
from typing import Any

PERF_DIR = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(PERF_DIR, "results")
BASELINES_DIR = os.path.join(PERF_DIR, "baselines")
PLOTS_DIR = os.path.join(PERF_DIR, "plots")


def ceiling_row(test_id: str, info: dict[str, Any]) -> dict[str, Any] | None:
    """One row of the perf suite's closing summary: how close a benchmark came to its ceiling (None: no ceiling).

    Kernels carry `fraction_of_ceiling` (of the measured copy bandwidth or matmul rate, perf/kernel_bench.py);
    engine runs carry `roofline_fraction` (of the workload's memory roofline, the package's roofline.py)."""
    fraction = info.get("fraction_of_ceiling", info.get("roofline_fraction"))
    if fraction is None:
        return None
    rate = next(((info[k], unit) for k, unit in (("gbps", "GB/s"), ("tflops", "TFLOP/s"), ("output_tok_s", "tok/s"))
                 if k in info), (None, ""))
    return {"benchmark": test_id, "case": info.get("case", ""), "us/call": info.get("us_per_call_event"),
            "rate": rate[0], "unit": rate[1], "of ceiling": f"{100 * fraction:.1f}%"}
