"""pytest plugin of the conformance suite, registered through the ``pytest11`` entry point ``nanovllm_ref``.

It holds what must exist before pytest collects anything, whichever directory it starts from: the
conformance options (``--engine``, ``--engine-arg``, ``--model``, ``--reference``, ``--dtype``, ``--tp``,
``--report``, ``--tol``, ``--prompt-tol``, ``--torch-threads``, ``--speculative-config``), the ``gpu`` / ``slow``
markers, the store of recorded reports and the end-of-run summary with the JSON report (report.py: no optional
package needed), ending in the per-capability verdict (capabilities.py: what the engine was checked on, and what
it was not, and why). Bad option values and unsupported torch / transformers / triton versions are usage errors at start
(suite_options.py). The suite's fixtures stay in ``conformance/conftest.py``.

So in another project, after ``pip install nanovllm_ref``::

    pytest --pyargs conformance --engine yourpkg.module:factory --model qwen3-tiny --dtype float32

Inside this repository the root ``conftest.py`` loads this module when the entry point did not (a checkout
that is not pip-installed); it is never registered twice. Another plugin or conftest that defines one of these
option names itself must be loaded before this one, or run pytest with ``-p no:nanovllm_ref``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .suite_options import parse_engine_args

REPORTS = pytest.StashKey[list]()
SPECULATION = pytest.StashKey[list]()  # speculative runs' counts (oracle/spec_decode.py speculation_meta)
CAPABILITIES = pytest.StashKey[dict]()  # nodeid -> capability, for the conformance suite's tests
MAX_KERNEL_SKIP_LINES = 5


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("conformance", "nanovllm_ref conformance suite (pytest --pyargs conformance)")
    options = (
        ("--engine", dict(default="nanovllm_ref",
                          help="engine under test: nanovllm_ref, hf, vllm, sglang, a server (openai:URL, trtllm:URL, "
                               "tgi:URL, sglang:URL, ollama:URL) or pkg.module:factory "
                               "(default nanovllm_ref)")),
        ("--engine-arg", dict(action="append", default=[], metavar="KEY=VALUE",
                              help="a setting for the engine's factory, e.g. max_model_len=512 or "
                                   "enforce_eager=true (VALUE parsed as JSON when it parses, else a string); "
                                   "repeatable")),
        ("--model", dict(action="append", default=[],
                         help="golden checkpoint name or checkpoint folder; repeatable or comma-separated "
                              "(default: every golden checkpoint; perf's benchmarks read the last one)")),
        ("--reference", dict(choices=("golden", "live", "none"), default="golden",
                             help="compare with the stored goldens, with transformers computed now, or with nothing "
                                  "(none: only the reference-free checks, e.g. self-consistency, on any checkpoint)")),
        ("--dtype", dict(default="float32,bfloat16", help="comma-separated dtypes (default float32,bfloat16)")),
        ("--tp", dict(type=int, default=1, help="tensor_parallel_size for the nanovllm_ref engine")),
        ("--report", dict(default="conformance-report.json", help="where to write the JSON report")),
        ("--tol", dict(type=float, default=None, help="override the generated-step logprob tolerance")),
        ("--prompt-tol", dict(type=float, default=None, help="override the prompt logprob tolerance")),
        ("--kernels", dict(default=None,
                           help="pkg.module:function returning the KernelCandidate list to check in "
                                "conformance/test_kernels.py (default: nanovllm_ref's kernels with "
                                "--engine nanovllm_ref, none otherwise); see nanovllm_ref/testing/kernels.py")),
        ("--invariance", dict(choices=("tolerance", "exact"), default="tolerance",
                              help="conformance/test_batch_invariance.py's verdict: the dtype policy (default) or "
                                   "bitwise equality (for engines with a batch-invariant mode)")),
        ("--invariance-trials", dict(type=int, default=3,
                                     help="random batch compositions per needle and case in "
                                          "test_batch_invariance.py (default 3; 20 on a GPU)")),
        ("--speculative-config", dict(default=None, metavar="JSON",
                                      help="one more speculative config for conformance/test_spec_decode*.py, "
                                           "passed as the factory's speculative_config, e.g. "
                                           "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}' (the engine's "
                                           "factory must take speculative_config)")),
        ("--torch-threads", dict(type=int, default=1,
                                 help="torch CPU threads while conformance tests run (default 1: the tiny models "
                                      "gain nothing from more, and on a loaded machine multi-threaded torch is "
                                      "very slow); 0 leaves torch's default")),
    )
    for name, kwargs in options:
        g.addoption(name, **kwargs)


def pytest_configure(config: pytest.Config) -> None:
    from .suite_options import check_server_reachable, check_suite_not_shadowed, check_versions, validate_options

    config.stash[REPORTS] = []
    config.stash[SPECULATION] = []
    config.stash[CAPABILITIES] = {}
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped elsewhere)")
    config.addinivalue_line("markers", "slow: long-running")
    if config.getoption("help", False) or config.getoption("version", 0):
        return
    check_suite_not_shadowed(config)
    check_versions()
    validate_options(config)
    check_server_reachable(config.getoption("--engine"))


def engine_args(config: pytest.Config) -> tuple[tuple[str, Any], ...]:
    return parse_engine_args(config.getoption("--engine-arg") or [])


def record_report(config: pytest.Config, report: Any) -> None:
    """Add a ConformanceReport to the end-of-run summary and the JSON report."""
    config.stash[REPORTS].append(report)


def record_speculation(config: pytest.Config, meta: dict[str, Any]) -> None:
    """Add one speculative run's counts (oracle/spec_decode.py) to the end-of-run section and the JSON report."""
    config.stash[SPECULATION].append(meta)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each test of the suite's capability (capabilities.py), by its module, name or the module's CAPABILITY."""
    from .capabilities import capability_of
    from .suite_options import installed_root

    if CAPABILITIES not in item.config.stash:
        return
    path = Path(str(item.path))
    if path.parent.name != "conformance" or path.parent.resolve() != installed_root() / "conformance":
        return
    declared = getattr(getattr(item, "module", None), "CAPABILITY", None)
    name = getattr(item, "originalname", None) or item.name.split("[")[0]
    item.config.stash[CAPABILITIES][item.nodeid] = capability_of(path.stem, name, declared)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands its reports to the controller, which prints the one summary and report."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["conformance_reports"] = [r.to_dict() for r in session.config.stash.get(REPORTS, [])]
        workeroutput["conformance_capabilities"] = dict(session.config.stash.get(CAPABILITIES, {}))
        workeroutput["conformance_speculation"] = list(session.config.stash.get(SPECULATION, []))


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, called on the controller as each worker finishes
def pytest_testnodedown(node: Any, error: Any) -> None:
    from .report import ConformanceReport

    output = getattr(node, "workeroutput", {})
    for d in output.get("conformance_reports", []):
        node.config.stash[REPORTS].append(ConformanceReport.from_dict(d))
    node.config.stash.setdefault(CAPABILITIES, {}).update(output.get("conformance_capabilities", {}))
    node.config.stash.setdefault(SPECULATION, []).extend(output.get("conformance_speculation", []))


def skip_reason(rep: Any) -> str:
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3 else ""
    return reason.removeprefix("Skipped: ")


def skipped_kernel_candidates(terminalreporter: Any) -> dict[str, int]:
    """``reason -> skipped cases`` of the kernel candidates that could not run here (conformance/test_kernels.py
    skips them with "kernel candidate NAME [LABEL]: why")."""
    counts: dict[str, int] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        reason = skip_reason(rep)
        if reason.startswith("kernel candidate "):
            counts[reason] = counts.get(reason, 0) + 1
    return counts


OUTCOMES = (("passed", "passed"), ("xpassed", "passed"), ("failed", "failed"), ("error", "failed"),
            ("skipped", "skipped"), ("xfailed", "skipped"))
RANK = {"skipped": 0, "passed": 1, "failed": 2}


def outcomes_by_test(stats: dict[str, list]) -> dict[str, tuple[str, str]]:
    """``nodeid -> (passed | failed | skipped, skip reason)`` over every phase (an error in teardown fails)."""
    out: dict[str, tuple[str, str]] = {}
    for key, outcome in OUTCOMES:
        for rep in stats.get(key, []):
            nodeid = getattr(rep, "nodeid", "")
            if "::" not in nodeid:  # a module's collection report
                continue
            reason = skip_reason(rep) if key == "skipped" else "expected to fail" if key == "xfailed" else ""
            if nodeid not in out or RANK[outcome] > RANK[out[nodeid][0]]:
                out[nodeid] = (outcome, reason)
    return out


def capability_tallies(terminalreporter: Any, config: pytest.Config, reports: list) -> dict[str, Any]:
    """Per capability of the suite, its tests' outcomes (empty when no conformance test ran)."""
    from .capabilities import record_capabilities, tally

    outcomes = outcomes_by_test(terminalreporter.stats)
    deselected = [getattr(i, "nodeid", "") for i in terminalreporter.stats.get("deselected", [])]
    mapping = config.stash.get(CAPABILITIES, {})
    if not mapping:
        return {}
    tallies = tally(outcomes, mapping, deselected)
    record_capabilities(tallies, [r.meta for r in reports])
    return tallies


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skipped = skipped_kernel_candidates(terminalreporter)
    if skipped:
        terminalreporter.section("kernel candidates skipped")
        for reason, n in list(skipped.items())[:MAX_KERNEL_SKIP_LINES]:
            terminalreporter.write_line(f"{reason} ({n} cases)")
        if len(skipped) > MAX_KERNEL_SKIP_LINES:
            terminalreporter.write_line(f"... and {len(skipped) - MAX_KERNEL_SKIP_LINES} more (-rs lists them)")
    reports, speculation = config.stash.get(REPORTS, []), config.stash.get(SPECULATION, [])
    tallies = capability_tallies(terminalreporter, config, reports)
    if reports or speculation:
        _report_summary(terminalreporter, config, reports, tallies, speculation)
    if speculation:
        from .spec_decode import summary_lines

        terminalreporter.section("speculative decoding")
        for line in summary_lines(speculation, verbose=config.getoption("verbose") > 0):
            terminalreporter.write_line(line)
    if tallies:
        from .capabilities import verdict_lines

        terminalreporter.section("conformance capabilities")
        for line in verdict_lines(tallies):
            terminalreporter.write_line(line)


def _report_summary(terminalreporter: Any, config: pytest.Config, reports: list, tallies: dict[str, Any],
                    speculation: list) -> None:
    from .report import ConformanceReport, terminal_summary_lines

    merged = ConformanceReport(meta={
        "engine": config.getoption("--engine"), "reference": config.getoption("--reference"),
        "tp": config.getoption("--tp"), "cases": [r.meta for r in reports],
        "capabilities": {name: t.as_dict() for name, t in tallies.items()},
        "speculative_decoding": speculation,
    })
    for r in reports:
        merged.extend(r)
    terminalreporter.section("conformance summary")
    for line in terminal_summary_lines(merged, verbose=config.getoption("verbose") > 0):
        terminalreporter.write_line(line)
    path = Path(config.getoption("--report"))
    path.write_text(merged.to_json() + "\n")
    failed_tests = len(terminalreporter.stats.get("failed", [])) + len(terminalreporter.stats.get("error", []))
    verdict = "all passed" if merged.passed else (f"{len(merged.failures())} prompts and "
                                                  f"{len(merged.set_failures)} whole sets FAILED")
    outside = f" ({failed_tests} tests failed or errored in all, see above)" if failed_tests else ""
    terminalreporter.write_line(f"\nconformance report: {len(reports)} comparisons recorded, {verdict}{outside}: "
                                f"{path}")
