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


def full_sweep(failing_sets: int) -> ConformanceReport:
    """The default sweep's shape: 15 checkpoints x 2 dtypes x 12 cases of 23 prompts, one diverged prompt per set
    (bf16 near-ties), and ``failing_sets`` sets with a failing prompt."""
    merged, failed = ConformanceReport(), 0
    models = [f"model-{i}-hd{32 * (1 + i % 3)}" for i in range(15)]
    for model in models:
        for dtype in ("float32", "bfloat16"):
            for case in range(12):
                ref = [out([1, 1], [STEP, STEP]) for _ in range(23)]
                cand = [out([1, 1], [STEP, STEP]) for _ in range(21)] + [out([1, 2], [STEP, STEP])]
                cand.append(out([9, 9], [{9: 0.0}, {9: 0.0}]) if failed < failing_sets else out([1, 1], [STEP, STEP]))
                failed += 1
                merged.extend(compare_all(ref, cand, top_k=3, tol=1e-3, prompt_tol=None, model=model, dtype=dtype,
                                          engine="nanovllm_ref", case=f"case-{case}",
                                          prompt_ids=[f"p{i}" for i in range(23)]))
    return merged


def test_the_terminal_summary_of_a_full_sweep_is_short_and_the_detail_is_kept() -> None:
    from nanovllm_ref.oracle.report import MAX_FAILURE_LINES, terminal_summary_lines

    for failing in (0, 3, 40):
        report = full_sweep(failing)
        assert len(summary_lines(report)) > 600  # what the run printed before
        lines = terminal_summary_lines(report)
        assert len(lines) <= 1 + 15 + MAX_FAILURE_LINES + 1 and all(len(line) <= WIDTH for line in lines), lines
        assert sum("FAIL model-" in line for line in lines) == min(failing, MAX_FAILURE_LINES), lines
        assert (f"and {failing - MAX_FAILURE_LINES} more failing sets" in lines[-1]) == (failing > MAX_FAILURE_LINES)
        assert sum(line.startswith("  model-") for line in lines) == 15
        assert len(terminal_summary_lines(report, verbose=True)) > 600  # -v: every case and prompt
    small = full_sweep(0)
    small.prompts = [p for p in small.prompts if p.model == "model-0-hd32" and p.case == "case-0"]
    assert terminal_summary_lines(small) == summary_lines(small)  # a short run keeps the detailed table
