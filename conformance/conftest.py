"""Options, fixtures and the end-of-run summary of the conformance suite (see conformance/README.md).

Options: --engine, --model, --reference golden|live, --dtype, --tp, --report, --tol, --prompt-tol.
Engines and references are built once per (model, dtype, settings) for the whole session and reused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nanovllm_ref.oracle.compare import ConformanceReport

from .harness import EnginePool, Options, ReferencePool, selected_models

HERE = Path(__file__).resolve().parent
REPORTS = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("conformance", "nanovllm_ref conformance suite")
    options = (
        ("--engine", dict(default="nanovllm_ref",
                          help="engine under test: nanovllm_ref, hf, or pkg.module:factory (default nanovllm_ref)")),
        ("--model", dict(action="append", default=[],
                         help="golden checkpoint name or checkpoint folder; repeatable or comma-separated "
                              "(default: every golden checkpoint)")),
        ("--reference", dict(choices=("golden", "live"), default="golden",
                             help="compare with the stored goldens, or with transformers computed now")),
        ("--dtype", dict(default="float32,bfloat16", help="comma-separated dtypes (default float32,bfloat16)")),
        ("--tp", dict(type=int, default=1, help="tensor_parallel_size for the nanovllm_ref engine")),
        ("--report", dict(default="conformance-report.json", help="where to write the JSON report")),
        ("--tol", dict(type=float, default=None, help="override the generated-step logprob tolerance")),
        ("--prompt-tol", dict(type=float, default=None, help="override the prompt logprob tolerance")),
        ("--torch-threads", dict(type=int, default=1,
                                 help="torch CPU threads while conformance tests run (default 1: the tiny models "
                                      "gain nothing from more, and on a loaded machine multi-threaded torch is "
                                      "very slow); 0 leaves torch's default")),
    )
    for name, kwargs in options:
        try:
            g.addoption(name, **kwargs)
        except ValueError:  # defined by another conftest of the same run (e.g. perf's --model): share it
            pass


def pytest_configure(config: pytest.Config) -> None:
    config.stash[REPORTS] = []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "model_spec" in metafunc.fixturenames:
        models = selected_models(metafunc.config)
        metafunc.parametrize("model_spec", models, ids=[m.name for m in models], scope="session")
    if "dtype" in metafunc.fixturenames:
        dtypes = [d.strip() for d in metafunc.config.getoption("--dtype").split(",") if d.strip()]
        metafunc.parametrize("dtype", dtypes, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _torch_threads(pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Pin torch's CPU threads for each conformance test (and TP workers, through OMP_NUM_THREADS)."""
    n = pytestconfig.getoption("--torch-threads")
    if n <= 0:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    monkeypatch.setenv("OMP_NUM_THREADS", str(n))
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def options(pytestconfig: pytest.Config) -> Options:
    return Options(pytestconfig.getoption("--engine"), pytestconfig.getoption("--reference"),
                   pytestconfig.getoption("--tp"), pytestconfig.getoption("--tol"),
                   pytestconfig.getoption("--prompt-tol"))


@pytest.fixture(scope="session")
def engines(options: Options) -> Any:
    pool = EnginePool(options)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def references(options: Options) -> ReferencePool:
    return ReferencePool(options)


@pytest.fixture(scope="session")
def record(pytestconfig: pytest.Config) -> Any:
    """``record(report)`` adds a ConformanceReport to the end-of-run summary and the JSON report."""
    return pytestconfig.stash[REPORTS].append


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    reports: list[ConformanceReport] = config.stash.get(REPORTS, [])
    if not reports:
        return
    import pandas as pd

    merged = ConformanceReport(meta={
        "engine": config.getoption("--engine"), "reference": config.getoption("--reference"),
        "tp": config.getoption("--tp"), "cases": [r.meta for r in reports],
    })
    for r in reports:
        merged.extend(r)
    with pd.option_context("display.width", 250, "display.max_colwidth", 110, "display.max_rows", 500,
                           "display.float_format", "{:.3g}".format):
        terminalreporter.section("conformance summary")
        terminalreporter.write_line(merged.summary_table("model").to_string(index=False))
        table = merged.summary_table("prompt")
        if config.getoption("verbose") <= 0:
            table = table[table["status"] != "match"]
            title = "prompts that did not match exactly (-v shows all)"
        else:
            title = "all prompts"
        if len(table):
            terminalreporter.write_line(f"\n{title}:")
            terminalreporter.write_line(table.to_string(index=False))
    path = Path(config.getoption("--report"))
    path.write_text(merged.to_json() + "\n")
    verdict = "all passed" if merged.passed else f"{len(merged.failures())} prompts FAILED"
    terminalreporter.write_line(f"\nconformance report: {len(reports)} comparisons recorded, {verdict} "
                                f"(tests that errored before comparing are not in it): {path}")
