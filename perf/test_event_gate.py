"""Tests of the device-time regression gate (perf/event_gate.py, `--event-compare-fail`), on the CPU.

Unit tests compare synthetic saved runs; the end-to-end test runs the perf suite's CPU smoke kernels and a
host-overhead benchmark through pytest (in this process: a subprocess costs ~6 s of imports each) with a
throw-away `--benchmark-storage`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from perf import PERF_DIR, event_gate

KERNELS, HOST = os.path.join(PERF_DIR, "test_kernels.py"), os.path.join(PERF_DIR, "test_host_overhead.py")


def _saved_run(path: Path, device_us: dict[str, float | None]) -> str:
    """A file shaped like pytest-benchmark's --benchmark-save output; None: a benchmark without device time."""
    benchmarks = [{"fullname": name, "stats": {"median": 1.0},
                   "extra_info": {} if us is None else {event_gate.EVENT_KEY: us, "case": name}}
                  for name, us in device_us.items()]
    path.write_text(json.dumps({"machine_info": {}, "benchmarks": benchmarks}))
    return str(path)


def test_parse_percent_takes_whole_and_decimal_percentages():
    assert [event_gate.parse_percent(t) for t in ("10", "2.5", "10%", " 0 ")] == [10.0, 2.5, 10.0, 0.0]
    for bad in ("ten", "-1", "inf", "nan", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="percentage"):
            event_gate.parse_percent(bad)


def test_compare_fails_over_the_limit_passes_under_and_lists_what_it_cannot_compare(tmp_path):
    base = event_gate.load_run(_saved_run(tmp_path / "base.json", {
        "k::slower": 100.0, "k::at_limit": 100.0, "k::faster": 50.0, "k::old_no_event": None, "k::gone": 5.0}))
    now = event_gate.load_run(_saved_run(tmp_path / "now.json", {
        "k::slower": 112.5, "k::at_limit": 110.0, "k::faster": 40.0, "k::old_no_event": 7.0, "k::added": 3.0,
        "engine::headline": None}))
    report = event_gate.compare(base, now, 10.0, "base.json")
    assert [(d.name, d.change_pct) for d in report.regressions] == [("k::slower", 12.5)]
    assert {d.name for d in report.deltas} == {"k::slower", "k::at_limit", "k::faster"}
    assert report.new == ("k::old_no_event", "k::added") and report.wall_only == ("engine::headline",)
    text = "\n".join(report.lines())
    assert "device-time gate FAILED: 1 of 3 benchmarks slower than the baseline by more than 10%" in text
    assert "k::slower: 100.000 us -> 112.500 us (+12.5%)" in text  # names the benchmark, both times, the change
    assert "new, not compared" in text and "k::added" in text and "wall-time gate only): engine::headline" in text
    assert not event_gate.compare(base, now, 12.5, "base.json").regressions  # +12.5% is not over a 12.5% limit
    decimal = event_gate.compare(base, now, 9.5, "base.json")  # a decimal limit: +10% is over 9.5%
    assert {d.name for d in decimal.regressions} == {"k::slower", "k::at_limit"}
    assert "device-time gate passed: 0 of 0" in "\n".join(event_gate.compare({}, now, 10.0, "empty").lines())


def test_no_baseline_is_a_usage_error_naming_the_storage():
    def session(compare, mapping):
        return SimpleNamespace(compare=compare, compared_mapping=mapping, storage="file:///runs/cpu")

    with pytest.raises(pytest.UsageError, match=r"needs --benchmark-compare"):
        event_gate.baselines(session(None, {}))
    with pytest.raises(pytest.UsageError, match=r"no baseline.*no saved run in file:///runs/cpu"):
        event_gate.baselines(session(True, {}))
    with pytest.raises(pytest.UsageError, match=r"no saved run matching '0042' in file:///runs/cpu"):
        event_gate.baselines(session("0042", {}))
    run = {"k::a": {"fullname": "k::a", "extra_info": {event_gate.EVENT_KEY: 1.0}}}
    assert event_gate.baselines(session(True, {Path("x/0001.json"): run})) == {
        "x/0001.json": {"k::a": {event_gate.EVENT_KEY: 1.0}}}


def test_wall_check_is_waived_only_where_device_time_judges():
    """pytest-benchmark's wall check keeps failing a benchmark without device time (engine, host overhead)."""
    wall = SimpleNamespace(fails=lambda current, compared: "Field 'median' has failed")
    found = {"0001.json": {"k::timed": {event_gate.EVENT_KEY: 3.0}, "engine::run": {"output_tok_s": 9.0}}}
    exempt: list[str] = []
    check = event_gate._WallCheckUnlessDeviceTimed(wall, found, exempt)
    timed = SimpleNamespace(extra_info={event_gate.EVENT_KEY: 9.0})
    assert check.fails(timed, {"path": "0001.json", "fullname": "k::timed"}) is None
    assert exempt == ["k::timed: Field 'median' has failed"]
    engine = SimpleNamespace(extra_info={"output_tok_s": 1.0})
    assert check.fails(engine, {"path": "0001.json", "fullname": "engine::run"}) == "Field 'median' has failed"
    new = SimpleNamespace(extra_info={event_gate.EVENT_KEY: 9.0})  # device-timed now, absent from the baseline
    assert check.fails(new, {"path": "0001.json", "fullname": "k::new"}) == "Field 'median' has failed"
    lost = SimpleNamespace(extra_info={})  # device-timed in the baseline, not now: nothing else judges it
    assert check.fails(lost, {"path": "0001.json", "fullname": "k::timed"}) == "Field 'median' has failed"
    assert len(exempt) == 1


def test_cli_compares_two_saved_runs(tmp_path, capsys):
    base = _saved_run(tmp_path / "base.json", {"k::a": 10.0, "k::b": 20.0})
    assert event_gate.main([base, _saved_run(tmp_path / "ok.json", {"k::a": 10.5, "k::b": 19.0}), "--fail", "10"]) == 0
    assert "passed: 0 of 2" in capsys.readouterr().out
    assert event_gate.main([base, _saved_run(tmp_path / "bad.json", {"k::a": 10.5, "k::b": 23.0}), "--fail", "10"]) == 1
    assert "k::b: 20.000 us -> 23.000 us (+15.0%)" in capsys.readouterr().out


def _perf_run(capsys: pytest.CaptureFixture, storage: Path, *args: str) -> tuple[int, str]:
    """pytest on the CPU smoke kernels and a host-overhead benchmark (no device time); its exit code and output.
    pytest-benchmark's failed wall gate raises out of pytest.main (a traceback and exit code 1 on the command line)."""
    from pytest_benchmark.session import PerformanceRegression

    try:
        code = int(pytest.main([KERNELS, HOST, "-q", "-p", "no:cacheprovider", f"--benchmark-storage=file://{storage}",
                                "--benchmark-columns=min", *args]))
    except PerformanceRegression:
        code = 1
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _scaled(run: dict, factor: float, stats: bool) -> str:
    """The run with every device time (and with `stats`, every wall-time statistic) multiplied by `factor`."""
    run = json.loads(json.dumps(run))
    for bench in run["benchmarks"]:
        if event_gate.EVENT_KEY in bench["extra_info"]:
            bench["extra_info"][event_gate.EVENT_KEY] *= factor
        for key in ("min", "max", "mean", "median") if stats else ():
            bench["stats"][key] *= factor
    return json.dumps(run)


@pytest.mark.filterwarnings("ignore:Can't compare. No benchmark files")  # pytest-benchmark's, for run 0009
def test_event_gate_end_to_end_on_the_cpu_smoke_benchmarks(tmp_path, capsys, monkeypatch):
    """Save a real run, then compare: with itself (passes); with a copy whose device times are 10,000x smaller
    (the device-time gate fails the session, pytest-benchmark's wall gate passes); with a copy whose wall times
    are 10,000x smaller too (the wall gate fails the host benchmark only, the device-time report still prints);
    with no saved run (a usage error before anything runs, perf/baseline_check.py)."""
    pytest.importorskip("pytest_benchmark")
    # under pytest-xdist (`pytest -n 2`) this worker's environment says so, and pytest-benchmark would disable the
    # nested session's benchmarks (nothing saved or compared): the nested session is not an xdist worker
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    store, host = tmp_path / "store", "perf/test_host_overhead.py::test_prefill_step_inputs[prefill]"
    code, out = _perf_run(capsys, store, "-k", "decode_attention_smoke or prefill_step_inputs and not mixed",
                          "--benchmark-save=base")
    assert code == 0, out[-3000:]
    [saved] = store.glob("*/0001_base.json")
    run = json.loads(saved.read_text())
    saved_info = {b["fullname"]: b["extra_info"] for b in run["benchmarks"]}
    assert saved_info["perf/test_kernels.py::test_decode_attention_smoke"][event_gate.EVENT_KEY] > 0
    assert event_gate.EVENT_KEY not in saved_info[host]

    both = ["-k", "decode_attention_smoke or rmsnorm_smoke or prefill_step_inputs and not mixed"]
    gates = ["--event-compare-fail=1000", "--benchmark-compare-fail=min:1000%"]
    # a shared CPU moves a tiny op's time by far less than 10x; rmsnorm is not in the baseline
    code, out = _perf_run(capsys, store, *both, "--benchmark-compare=0001", "--event-compare-fail=1000")
    assert code == 0, out[-3000:]
    assert "device-time gate passed: 0 of 1 benchmarks" in out
    assert "not compared" in out and "perf/test_kernels.py::test_rmsnorm_smoke" in out
    assert f"(wall-time gate only): {host}" in out

    saved.with_name("0002_fast_device.json").write_text(_scaled(run, 1e-4, stats=False))
    code, out = _perf_run(capsys, store, *both, "--benchmark-compare=0002", *gates)
    assert code == pytest.ExitCode.TESTS_FAILED, out[-3000:]
    assert "Performance has regressed" not in out  # the failure is the device-time gate's, not pytest-benchmark's
    assert "device-time gate FAILED: 1 of 1 benchmarks slower than the baseline by more than 1000%" in out
    assert "REGRESSED  perf/test_kernels.py::test_decode_attention_smoke" in out

    saved.with_name("0003_fast_all.json").write_text(_scaled(run, 1e-4, stats=True))
    code, out = _perf_run(capsys, store, *both, "--benchmark-compare=0003", *gates)
    assert code == 1 and "device-time gate FAILED: 1 of 1" in out
    wall_failures = out.split("Performance has regressed")[1].split("-----")[0]
    assert "test_prefill_step_inputs[prefill]" in wall_failures and "decode_attention" not in wall_failures
    assert "wall-time regression not gated (its device time is): perf/test_kernels.py::test_decode_attention" in out

    code, out = _perf_run(capsys, store, *both, "--benchmark-compare=0009", "--event-compare-fail=10")
    assert code == pytest.ExitCode.USAGE_ERROR and "no saved benchmark run matching '0009'" in out
    code, out = _perf_run(capsys, store, *both, "--event-compare-fail=10")
    assert code == pytest.ExitCode.USAGE_ERROR and "needs --benchmark-compare" in out
