"""The per-capability verdict (nanovllm_ref/oracle/capabilities.py, printed by the pytest plugin): an engine with
only the minimal protocol (name, generate, close) is told which capabilities were not checked and what enables
them, its passes never include the oracle's self-tests, and a module the table does not know (a check added later)
is a capability of its own, described by its skip reasons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from nanovllm_ref.oracle.capabilities import SELF_TESTS, Tally, capability_of, record_capabilities, tally, verdict_lines

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = '''
from nanovllm_ref.oracle.adapters import NanovllmRefAdapter


class Minimal:  # the documented minimal protocol: name, generate, close; nothing else
    name = "minimal"

    def __init__(self, model_path, dtype):
        self._engine = NanovllmRefAdapter(model_path, dtype)

    def generate(self, prompts, max_tokens, top_k, prompt_logprobs):
        return self._engine.generate(prompts, max_tokens, top_k, prompt_logprobs)

    def close(self):
        self._engine.close()


def make_engine(model_path, dtype, **kwargs):
    return Minimal(model_path, dtype)
'''


def test_tests_map_to_capabilities_by_module_name_or_declaration() -> None:
    assert capability_of("test_golden", "test_golden") == "goldens"
    assert capability_of("test_sampling", "test_seeded_samples_reproducible_one_by_one") == "seeds"
    assert capability_of("test_sampling", "test_sampling_distribution") == "sampling"
    assert capability_of("test_text", "test_stop_reason") == "stops"
    assert capability_of("test_policy", "test_match_and_max_diff") == SELF_TESTS
    assert capability_of("test_logit_bias_stream", "test_x") == "logit bias stream"  # a module added later
    assert capability_of("test_text", "test_text", declared="detokenizer") == "detokenizer"


def test_the_verdict_names_what_was_not_checked_and_keeps_self_tests_apart() -> None:
    outcomes = {"g": ("passed", ""), "s1": ("skipped", "engine e has no run_requests"),
                "s2": ("skipped", "engine e has no run_requests"), "n": ("skipped", "needs a new_method"),
                **{f"p{i}": ("passed", "") for i in range(16)}, "f": ("failed", "")}
    capability = {"g": "goldens", "s1": "sampling", "s2": "sampling", "n": "new check", "f": "prefix cache",
                  **{f"p{i}": SELF_TESTS for i in range(16)}}
    capability["d"] = "serving"
    tallies = tally(outcomes, capability, deselected=["d"])
    record_capabilities(tallies, [{"mode": "tokens-only", "prompt_logprobs": False}])
    lines = verdict_lines(tallies)
    row = {line.split("  ")[0].strip(): line for line in lines[1:] if not line.startswith(("capability", " "))}
    assert row["goldens"].split()[1] == "checked"
    assert "NOT CHECKED" in row["sampling"] and "run_requests (oracle/requests.py) | engine e has no run_requests" \
        in row["sampling"]
    assert "NOT CHECKED" in row["new check"] and "needs a new_method" in row["new check"]
    assert "NOT CHECKED" in row["top-k logprobs"] and "FAILED" in row["prefix cache"]
    assert "NOT CHECKED" in row["serving"] and row["serving"].endswith("| deselected (-k, -m or the default sweep)")
    verdict = " ".join(line.strip() for line in lines[lines.index(next(x for x in lines if x.startswith(
        "capability verdict"))):])
    assert "(1 engine tests passed, 1 failed)" in verdict  # the 16 self-tests are not the engine's
    assert "NOT CHECKED: top-k logprobs, prompt logprobs, sampling, serving, new check" in verdict
    assert all(len(line) <= 120 for line in lines)
    assert Tally(passed=1, skipped=2).state() == "partly" and Tally(reasons=Counter()).state() == "NOT CHECKED"


def test_a_minimal_protocol_engine_is_told_what_was_not_checked(tmp_path: Path) -> None:
    (tmp_path / "minimal_engine.py").write_text(MINIMAL)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "OMP_NUM_THREADS": "1"}
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pytest", "conformance", "--engine", "minimal_engine:make_engine", "--model",
           "qwen3-tiny", "--dtype", "float32", "-q", "-p", "no:cacheprovider", "--report", str(report),
           "-k", "test_golden or test_sampling_distribution or test_text or test_policy or test_serving"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    text = out.stdout
    section = text[text.index("conformance capabilities"):]
    rows = {line.split("  ")[0]: line for line in section.splitlines()[1:]}
    assert rows["goldens"].split()[1] in ("checked", "partly"), section  # the GPU variant skips off a GPU
    for name, enabled_by in (("sampling", "run_requests"), ("text", "run_requests"), ("serving", "openai:URL")):
        assert "NOT CHECKED" in rows[name] and enabled_by in rows[name], section
    assert rows[SELF_TESTS].split()[2:5] == ["checked", "16", "0"], section
    verdict = " ".join(section[section.index("capability verdict"):].split())
    missing = verdict.split("NOT CHECKED: ")[1].split(";")[0].split(", ")
    assert {"sampling", "text", "stops", "serving"} <= set(missing) and "goldens" not in missing, verdict
    assert "(1 engine tests passed" in verdict, verdict  # test_golden; the 16 self-tests apart
    meta = json.loads(report.read_text())["meta"]["capabilities"]
    assert meta["sampling"]["verdict"] == "NOT CHECKED" and meta[SELF_TESTS]["passed"] == 16
    summary = text[text.index("=" * 10):]  # from the first section to pytest's last line
    assert len(summary.splitlines()) <= 60, summary


def test_workers_hand_their_tests_capabilities_to_the_controller() -> None:
    """Under pytest-xdist only the workers collect: the controller's verdict needs their nodeid -> capability."""
    import types

    from nanovllm_ref.oracle import pytest_plugin

    mapping = {"conformance/test_text.py::test_text[a]": "text"}
    worker = types.SimpleNamespace(stash={pytest_plugin.REPORTS: [], pytest_plugin.CAPABILITIES: mapping},
                                   workeroutput={})
    pytest_plugin.pytest_sessionfinish(types.SimpleNamespace(config=worker))
    controller = types.SimpleNamespace(stash={pytest_plugin.REPORTS: [], pytest_plugin.CAPABILITIES: {}})
    pytest_plugin.pytest_testnodedown(types.SimpleNamespace(config=controller, workeroutput=worker.workeroutput), None)
    assert controller.stash[pytest_plugin.CAPABILITIES] == mapping
