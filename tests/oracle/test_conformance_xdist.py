"""Under pytest-xdist (how `nox -s conformance` runs) every worker's conformance reports reach the controller,
which alone prints the summary and writes the JSON report; conformance tests of one model share a worker."""

from __future__ import annotations

import types

import pytest

from nanovllm_ref.oracle import pytest_plugin
from nanovllm_ref.oracle.report import ConformanceReport, PromptReport


def _report(model: str, status: str) -> ConformanceReport:
    p = PromptReport(prompt_id="p0", status=status, num_tokens=4, matched_tokens=2, first_divergence=2,
                     max_abs_diff=0.5, where="gen step 2", max_gen_diff=0.5, max_prompt_diff=0.0, message="m",
                     failures=["f"] if status == "fail" else [], model=model, dtype="float32", engine="e", case="c")
    return ConformanceReport([p], {"model": model})


def test_worker_reports_reach_the_controller():
    worker = types.SimpleNamespace(stash={pytest_plugin.REPORTS: [_report("a", "match"), _report("b", "fail")]},
                                   workeroutput={})
    pytest_plugin.pytest_sessionfinish(types.SimpleNamespace(config=worker))
    controller = types.SimpleNamespace(stash={pytest_plugin.REPORTS: []})
    node = types.SimpleNamespace(config=controller, workeroutput=worker.workeroutput)
    pytest_plugin.pytest_testnodedown(node, None)
    got = controller.stash[pytest_plugin.REPORTS]
    assert [r.to_dict() for r in got] == [r.to_dict() for r in worker.stash[pytest_plugin.REPORTS]]
    assert not got[1].passed and got[1].prompts[0].failures == ["f"]


def test_a_run_without_xdist_keeps_its_reports_local():
    config = types.SimpleNamespace(stash={pytest_plugin.REPORTS: [_report("a", "match")]})
    pytest_plugin.pytest_sessionfinish(types.SimpleNamespace(config=config))
    assert not hasattr(config, "workeroutput")


def test_conformance_items_are_grouped_by_model():
    pytest.importorskip("xdist")
    from conformance import conftest

    spec = types.SimpleNamespace(name="qwen3-tiny")
    item = types.SimpleNamespace(callspec=types.SimpleNamespace(params={"model_spec": spec}), markers=[],
                                 keywords={}, path="x")
    item.add_marker = item.markers.append
    config = types.SimpleNamespace(pluginmanager=types.SimpleNamespace(hasplugin=lambda name: name == "xdist"),
                                   getoption=lambda name: ["qwen3-tiny"])  # --model given: no case deselected
    conftest.pytest_collection_modifyitems(config, [item])
    assert [(m.name, m.args) for m in item.markers] == [("xdist_group", ("qwen3-tiny",))]
