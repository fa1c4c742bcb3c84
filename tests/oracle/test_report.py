"""The end-of-run summary (nanovllm_ref/oracle/report.py): plain Python (no pandas or other optional package),
grouped by model and dtype under one heading each, every line within 120 columns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nanovllm_ref.oracle.compare import EngineOutput, compare_all
from nanovllm_ref.oracle.report import WIDTH, ConformanceReport, summary_lines

ROOT = Path(__file__).resolve().parents[2]
STEP = {1: -0.5, 2: -0.6, 3: -3.0}


def out(tokens: list[int], steps: list[dict]) -> EngineOutput:
    return EngineOutput(tokens, steps, None)


def report() -> ConformanceReport:
    merged = ConformanceReport()
    for model, dtype in (("qwen3-tiny", "float32"), ("qwen3-tiny", "bfloat16"), ("llama3-tiny", "float32")):
        ref = [out([1, 1], [STEP, STEP]) for _ in range(3)]
        cand = [out([1, 1], [STEP, STEP]), out([1, 2], [STEP, STEP]),
                out([9, 9], [{9: 0.0}, {9: 0.0}])]
        merged.extend(compare_all(ref, cand, top_k=3, tol=1e-3, prompt_tol=None, model=model, dtype=dtype,
                                  engine="an-engine-with-a-long-name", case="golden",
                                  prompt_ids=["p0", "p1", "prompt-with-a-long-name-" * 4]))
    return merged


def test_rows_are_grouped_by_model_and_dtype_within_the_width() -> None:
    lines = summary_lines(report())
    headings = [line for line in lines if not line.startswith(" ")]
    assert headings == ["qwen3-tiny / float32 / engine an-engine-with-a-long-name",
                        "qwen3-tiny / bfloat16 / engine an-engine-with-a-long-name",
                        "llama3-tiny / float32 / engine an-engine-with-a-long-name"]
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    first = lines[: lines.index(headings[1])]
    set_row = next(line for line in first if line.strip().startswith("golden"))
    assert set_row.split()[:5] == ["golden", "3", "1", "1", "1"]  # prompts, match, diverged-ok, fail
    assert any("diverged-ok" in line for line in first) and any("fail" in line.split() for line in first)
    assert not any(" p0 " in line for line in first)  # exact matches only with -v
    assert any(" p0 " in line for line in summary_lines(report(), all_prompts=True))


def test_the_summary_needs_no_optional_package() -> None:
    """With pandas blocked (an environment without it), the summary and the JSON report still come out."""
    code = ("import sys; sys.modules['pandas'] = None\n"
            "from tests.oracle.test_report import report\n"
            "from nanovllm_ref.oracle.report import summary_lines\n"
            "r = report(); print(len(summary_lines(r)), len(r.to_json()) > 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split()[1] == "True", proc.stderr
