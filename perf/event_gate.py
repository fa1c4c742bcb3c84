"""Device-time regression gate of the perf suite: `--event-compare-fail=PCT`.

pytest-benchmark's `--benchmark-compare-fail` judges the wall time of a round (perf_counter around the launches
and a synchronize): a slower host CPU on the device machine trips it, and a device regression smaller than the
host noise hides in it. Its timer cannot be CUDA events (it calls a clock function on the host), so
perf/kernel_bench.run_case records the CUDA-event time per call in `extra_info["us_per_call_event"]`. This gate
compares that figure with the same key in the run(s) pytest-benchmark itself chose for `--benchmark-compare[=NUM]`
(`BenchmarkSession.compared_mapping`, loaded in its pytest_configure), and fails the session when a benchmark is
slower by more than PCT percent.
A benchmark judged here is exempt from `--benchmark-compare-fail`, which keeps gating the others (engine and
host-overhead benchmarks have no device time). Wired from perf/conftest.py; perf/README.md says why.
`python -m perf.event_gate BASELINE.json CURRENT.json --fail 10` compares two saved runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from nanovllm_ref.testing.bench.tables import text_table

EVENT_KEY = "us_per_call_event"
Run = Mapping[str, Mapping[str, Any]]  # benchmark fullname -> its extra_info
_BASELINES, _REPORTS, _EXEMPT = pytest.StashKey[dict](), pytest.StashKey[list](), pytest.StashKey[list]()


def parse_percent(text: str) -> float:
    """Type of --event-compare-fail: a whole or decimal percentage ('10', '2.5', '10%')."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (e.g. 10 or 2.5)") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: the percentage must be finite and >= 0")
    return value


def _device_us(info: Mapping[str, Any] | None) -> float | None:
    value = (info or {}).get(EVENT_KEY)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


@dataclass(frozen=True)
class Delta:
    name: str
    baseline_us: float
    current_us: float

    @property
    def change_pct(self) -> float:
        return (self.current_us - self.baseline_us) / self.baseline_us * 100


@dataclass(frozen=True)
class GateReport:
    """One baseline run against the current one: `deltas` compared; `new` and `wall_only` not (names)."""
    source: str
    limit_pct: float
    deltas: tuple[Delta, ...]
    new: tuple[str, ...]
    wall_only: tuple[str, ...]

    @property
    def regressions(self) -> tuple[Delta, ...]:
        return tuple(d for d in self.deltas if d.change_pct > self.limit_pct)

    def lines(self) -> list[str]:
        rows = [{"gate": "REGRESSED" if d in self.regressions else "ok", "benchmark": d.name,
                 "baseline us": d.baseline_us, "current us": d.current_us, "change": f"{d.change_pct:+.1f}%"}
                for d in self.deltas]
        out = [f"{EVENT_KEY} against {self.source}, limit +{self.limit_pct:g}%"]
        out += text_table(rows).splitlines() if rows else []
        out += [f"new, not compared (not in the baseline, or without {EVENT_KEY} there): {name}" for name in self.new]
        if self.wall_only:
            out.append(f"no {EVENT_KEY} (wall-time gate only): {', '.join(self.wall_only)}")
        bad = self.regressions
        out.append(f"device-time gate {'FAILED' if bad else 'passed'}: {len(bad)} of {len(self.deltas)} benchmarks "
                   f"slower than the baseline by more than {self.limit_pct:g}%")
        return out + [f"  {d.name}: {d.baseline_us:.3f} us -> {d.current_us:.3f} us ({d.change_pct:+.1f}%)"
                      for d in bad]


def compare(baseline: Run, current: Run, limit_pct: float, source: str) -> GateReport:
    deltas, new, wall_only = [], [], []
    for name, info in current.items():
        now, then = _device_us(info), _device_us(baseline.get(name))
        if now is None:
            wall_only.append(name)
        elif then is None:
            new.append(name)
        else:
            deltas.append(Delta(name, then, now))
    return GateReport(source, limit_pct, tuple(deltas), tuple(new), tuple(wall_only))


def load_run(path: str) -> dict[str, Mapping[str, Any]]:
    """{fullname: extra_info} of a run saved by pytest-benchmark (--benchmark-save / --benchmark-json)."""
    with open(path) as f:
        return {b["fullname"]: b.get("extra_info", {}) for b in json.load(f)["benchmarks"]}


def baselines(bench_session: Any) -> dict[str, Run]:
    """{path: run} of the saved run(s) pytest-benchmark compares against; a usage error when there is none."""
    if not getattr(bench_session, "compare", None):
        raise pytest.UsageError("--event-compare-fail needs --benchmark-compare[=NUM]: it gates on the same "
                                "baseline run as pytest-benchmark")
    if not bench_session.compared_mapping:
        which = "" if bench_session.compare is True else f" matching {bench_session.compare!r}"
        raise pytest.UsageError(f"--event-compare-fail: no baseline to compare with: no saved run{which} in "
                                f"{bench_session.storage}")
    return {str(path): {name: b.get("extra_info", {}) for name, b in run.items()}
            for path, run in bench_session.compared_mapping.items()}


class _WallCheckUnlessDeviceTimed:
    """pytest-benchmark's wall-time check, waived for a benchmark with device time in both runs (judged here)."""

    def __init__(self, check: Any, found: dict[str, Run], exempt: list[str]) -> None:
        self.check, self.found, self.exempt = check, found, exempt

    def fails(self, current: Any, compared: Mapping[str, Any]) -> str | None:
        message = self.check.fails(current, compared)
        then = self.found.get(compared["path"], {}).get(compared["fullname"])
        if message and _device_us(current.extra_info) and _device_us(then):
            self.exempt.append(f"{compared['fullname']}: {message}")
            return None
        return message


def start(config: pytest.Config) -> None:
    """pytest_sessionstart: find the baseline before any benchmark runs; waive the wall check where it applies."""
    if config.getoption("event_compare_fail", None) is None:
        return
    bench_session = getattr(config, "_benchmarksession", None)
    if bench_session is None:
        raise pytest.UsageError("--event-compare-fail needs pytest-benchmark (pip install pytest-benchmark)")
    found = config.stash[_BASELINES] = baselines(bench_session)
    exempt = config.stash[_EXEMPT] = []
    if bench_session.compare_fail:
        bench_session.compare_fail = [_WallCheckUnlessDeviceTimed(c, found, exempt) for c in bench_session.compare_fail]


def finish(session: pytest.Session) -> None:
    """pytest_sessionfinish: compare with every baseline run; a regression makes the exit status non-zero."""
    config = session.config
    if _BASELINES not in config.stash:
        return
    current = {b.fullname: b.extra_info for b in config._benchmarksession.benchmarks}
    limit = config.getoption("event_compare_fail")
    reports = [compare(run, current, limit, path) for path, run in config.stash[_BASELINES].items()]
    config.stash[_REPORTS] = reports
    if any(r.regressions for r in reports) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def summary(terminalreporter: Any) -> None:
    config = terminalreporter.config
    for report in config.stash.get(_REPORTS, []):
        terminalreporter.write_sep("-", "device-time gate (--event-compare-fail)")
        for line in report.lines():
            terminalreporter.write_line(line)
    for line in config.stash.get(_EXEMPT, []):
        terminalreporter.write_line(f"wall-time regression not gated (its device time is): {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compare the device times of two saved pytest-benchmark runs")
    parser.add_argument("baseline")
    parser.add_argument("current")
    parser.add_argument("--fail", type=parse_percent, default=10.0, help="percent slower that fails (default 10)")
    args = parser.parse_args(argv)
    report = compare(load_run(args.baseline), load_run(args.current), args.fail, args.baseline)
    print("\n".join(report.lines()))
    return 1 if report.regressions else 0


if __name__ == "__main__":
    sys.exit(main())
