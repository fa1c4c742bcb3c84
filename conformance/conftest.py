"""Fixtures and parametrization of the conformance suite (see conformance/README.md).

The options (--engine, --model, --reference golden|live, --dtype, --tp, --report, --tol, --prompt-tol,
--torch-threads), the markers and the end-of-run summary live in the pytest plugin
``nanovllm_ref.oracle.pytest_plugin``, so that they exist whichever directory pytest starts from
(``pytest --pyargs conformance`` in another project). Engines and references are built once per
(model, dtype, settings) for the whole session and reused.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from nanovllm_ref.testing.interpreter import use_triton_interpreter

use_triton_interpreter()  # test_kernels.py: Triton kernels in the interpreter on a machine without a GPU

from nanovllm_ref.oracle.pytest_plugin import engine_args, record_report, record_speculation  # noqa: E402

from .harness import (  # noqa: E402
    EnginePool,
    Options,
    ReferencePool,
    deselect_invariance_cases,
    selected_dtypes,
    selected_models,
    speculative_cases,
)

HERE = Path(__file__).resolve().parent


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "model_spec" in metafunc.fixturenames:
        models = selected_models(metafunc.config)
        metafunc.parametrize("model_spec", models, ids=[m.name for m in models], scope="session")
    if "dtype" in metafunc.fixturenames:
        metafunc.parametrize("dtype", selected_dtypes(metafunc.config), scope="session")
    if "spec" in metafunc.fixturenames:  # test_spec_decode*.py: module-scoped, so a config's cases run together
        cases = speculative_cases(metafunc.config)
        metafunc.parametrize("spec", cases, ids=[c.id for c in cases], scope="module")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    deselect_invariance_cases(config, items)
    if config.getoption("--reference") == "none":  # only the modules that need no reference outputs run
        skip_ref = pytest.mark.skip(reason="--reference none: this module compares with a reference")
        for item in items:
            if not getattr(item.module, "REFERENCE_FREE", False):
                item.add_marker(skip_ref)

    if config.pluginmanager.hasplugin("xdist"):  # `-n N --dist loadgroup`: a model's tests share one worker's engines
        for item in items:
            spec = getattr(item, "callspec", None) and item.callspec.params.get("model_spec")
            if spec is not None:
                item.add_marker(pytest.mark.xdist_group(spec.name))
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
                   pytestconfig.getoption("--prompt-tol"), engine_args(pytestconfig))


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
    return functools.partial(record_report, pytestconfig)


@pytest.fixture(scope="session")
def record_spec(pytestconfig: pytest.Config) -> Any:
    """``record_spec(meta)`` adds a speculative run's counts (oracle/spec_decode.py) to the summary and the report."""
    return functools.partial(record_speculation, pytestconfig)
