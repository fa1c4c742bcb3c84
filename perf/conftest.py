"""pytest setup of the perf suite: options, markers, per-GPU baseline storage, machine info, device ceilings.

- `--arch NAME` (default qwen3-0.6b) / `--model PATH` choose the model of the engine and kernel benchmarks.
- `--perf-smoke` also runs the CPU smoke variants on a GPU machine (they run by default only without a GPU,
  so GPU baselines hold GPU numbers only).
- Baselines: unless `--benchmark-storage` is given, runs are saved to / compared with
  `perf/baselines/<gpu-slug>/` (e.g. `perf/baselines/nvidia-h200/`, `perf/baselines/cpu/`). pytest-benchmark
  builds its storage in its own `pytest_configure` (trylast); this one is tryfirst, so the option is set first.
- `pytest_benchmark_update_machine_info` adds the GPU name and count, driver, torch / triton / CUDA versions.
- `ceilings` (session): copy bandwidth and matmul rate of the device, measured once.
- At the end, a table prints every benchmark's fraction of its ceiling (kernels: measured copy bandwidth or
  matmul rate; engine: the workload's memory roofline), so a run shows the targets without opening the JSON.
- `--event-compare-fail=PCT` (with `--benchmark-compare[=NUM]`): the device-time gate of perf/event_gate.py.
- `--benchmark-compare` / `--benchmark-compare-fail` with no saved run to compare with: a one-line usage error
  before collection (perf/baseline_check.py).
Without pytest-benchmark installed, a minimal `benchmark` fixture runs the same code (no stats saved).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from nanovllm_ref.testing.bench.device import gpu_slug, has_cuda, machine_info, measure_ceilings
from nanovllm_ref.testing.bench.models import ModelShape, model_folder, read_config
from nanovllm_ref.testing.bench.roofline import Ceilings
from nanovllm_ref.testing.bench.tables import text_table
from perf import BASELINES_DIR, PERF_DIR, ceiling_row, event_gate
from perf.baseline_check import require_baseline

DEFAULT_STORAGE = "file://./.benchmarks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nanovllm_ref perf")
    for name, kwargs in (
        ("--arch", dict(default="qwen3-0.6b", help="architecture of the perf benchmarks (testing/bench/models.py)")),
        ("--model", dict(default=None, help="a real checkpoint folder for the perf benchmarks (overrides --arch)")),
        ("--perf-smoke", dict(action="store_true", help="also run the CPU smoke variants when a GPU is present")),
        ("--cpu-min-speedup", dict(type=float, default=1.5,
                                   help="cpu_bench gate: nanovllm_ref's least median speed-up over transformers")),
        ("--event-compare-fail", dict(type=event_gate.parse_percent, default=None, metavar="PCT",
                                      help="fail when a benchmark's CUDA-event time per call (extra_info) is more "
                                           "than PCT percent slower than in the --benchmark-compare baseline")),
    ):
        try:
            group.addoption(name, **kwargs)
        except (ValueError, argparse.ArgumentError):  # --model: the conformance plugin defines it first
            pass


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped elsewhere)")
    config.addinivalue_line("markers", "smoke: CPU-sized variant of a benchmark (runs where there is no GPU)")
    config.addinivalue_line("markers", "cpu_bench: the full CPU engine benchmark vs its peers (CI deselects it)")
    if not has_cuda():
        # CPU smoke: one intra-op thread (tiny tensors; with more threads than idle cores, torch spins and
        # a step gets ~10x slower)
        import torch

        torch.set_num_threads(1)
    storage = getattr(config.option, "benchmark_storage", None)
    if storage is not None and storage == DEFAULT_STORAGE:
        config.option.benchmark_storage = f"file://{BASELINES_DIR}/{gpu_slug()}"
    require_baseline(config, gpu_slug())  # before collection: a gate that compares nothing must not pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = has_cuda()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_smoke = pytest.mark.skip(reason="CPU smoke variant: skipped on a GPU machine unless --perf-smoke")
    for item in items:
        if not str(item.path).startswith(PERF_DIR + os.sep):  # this hook sees the whole session's items
            continue
        if item.get_closest_marker("gpu") and not cuda:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("smoke") and cuda and not config.getoption("perf_smoke", False):
            item.add_marker(skip_smoke)


@pytest.hookimpl(optionalhook=True)  # the hook exists only with pytest-benchmark installed
def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    machine_info.update(_machine_info())


_INFO: dict[str, Any] = {}


def _machine_info() -> dict[str, Any]:
    if not _INFO:
        _INFO.update(machine_info())
    return _INFO


_CEILING_ROWS = pytest.StashKey[list]()


@pytest.fixture(autouse=True)
def _record_ceiling_fraction(request: pytest.FixtureRequest):
    bench = request.getfixturevalue("benchmark") if "benchmark" in request.fixturenames else None
    yield
    if bench is not None:
        row = ceiling_row(request.node.name, bench.extra_info)
        if row is not None:
            request.config.stash.setdefault(_CEILING_ROWS, []).append(row)


def pytest_sessionstart(session: pytest.Session) -> None:
    event_gate.start(session.config)  # a usage error before any benchmark runs when there is no baseline


def pytest_sessionfinish(session: pytest.Session) -> None:
    event_gate.finish(session)  # inside the terminal reporter's wrapper: before the summary below


@pytest.hookimpl(wrapper=True)  # after pytest-benchmark's tables, even when its wall gate raised
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> Any:
    try:
        return (yield)
    finally:
        rows = config.stash.get(_CEILING_ROWS, [])
        if rows:
            terminalreporter.write_sep("-", "fraction of the measured ceilings (perf/README.md)")
            terminalreporter.write_line(text_table(rows))
        event_gate.summary(terminalreporter)


@pytest.fixture(scope="session")
def ceilings() -> Ceilings:
    return measure_ceilings("cuda" if has_cuda() else "cpu")


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name, None)
    if isinstance(value, list):  # conformance's --model is append-style
        value = value[-1] if value else None
    return value


@pytest.fixture(scope="session")
def perf_model(pytestconfig: pytest.Config) -> tuple[str, str | None]:
    """(arch, model path or None) of the GPU benchmarks."""
    return _option(pytestconfig, "arch") or "qwen3-0.6b", _option(pytestconfig, "model")


@pytest.fixture(scope="session")
def shape(perf_model: tuple[str, str | None]) -> ModelShape:
    arch, model = perf_model
    return ModelShape.from_config(read_config(model_folder(arch, model)))


class _Stats:
    def __init__(self, times: list[float]) -> None:
        self.median = statistics.median(times)
        self.min, self.max, self.mean = min(times), max(times), statistics.fmean(times)
        self.rounds = len(times)


class _MiniBenchmark:
    """Stand-in for pytest-benchmark's fixture (pedantic only) when the plugin is not installed."""

    def __init__(self) -> None:
        self.extra_info: dict[str, Any] = {}
        self.stats: Any = None
        self.group: str | None = None

    def pedantic(self, target: Callable, args: tuple = (), kwargs: dict | None = None, setup: Callable | None = None,
                 rounds: int = 1, warmup_rounds: int = 0, iterations: int = 1, **_: Any) -> Any:
        times, result = [], None
        for i in range(warmup_rounds + rounds):
            a, k = (setup() or (args, kwargs or {})) if setup else (args, kwargs or {})
            t0 = time.perf_counter()
            for _ in range(iterations):
                result = target(*a, **k)
            if i >= warmup_rounds:
                times.append((time.perf_counter() - t0) / iterations)
        self.stats = type("Metadata", (), {"stats": _Stats(times)})()
        return result


try:
    import pytest_benchmark  # noqa: F401
except ImportError:

    @pytest.fixture
    def benchmark() -> _MiniBenchmark:
        return _MiniBenchmark()
