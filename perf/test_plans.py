"""perf/plans.py, the device entry point: every plan's commands name tools that exist in this tree, and the
runner keeps order, runs `alongside` steps in the background, records exit codes, timeouts and result lines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from perf import plans
from perf.plans import ROOT, Plan, Step


def test_every_plan_runs_tools_of_this_tree(tmp_path: Path) -> None:
    assert {"headline", "conformance", "kernels", "mutants", "tp"} <= plans.PLANS.keys()
    for plan in plans.PLANS.values():
        for step in plan.steps:
            argv = plans.command(step, tmp_path)
            assert argv[0] == sys.executable and argv[1] == "-m", (plan.name, step.name)
            assert importlib.util.find_spec(argv[2]) is not None, (plan.name, step.name, argv[2])
            for arg in argv[3:]:
                if arg.endswith(".py") and "/" in arg:  # test files, by path from the repository root
                    assert (ROOT / arg.split("::")[0]).is_file(), (plan.name, step.name, arg)


def test_the_kernel_steps_are_the_kernel_list_of_the_tests() -> None:
    from nanovllm_ref.testing.kernels import KERNELS, nanovllm_ref_candidates

    steps = {s.name for s in plans.PLANS["conformance"].steps if s.name.startswith("kernel_")}
    ours = {c.kernel for c in nanovllm_ref_candidates()}
    assert steps == {f"kernel_{k}" for k in KERNELS if k in ours} and len(steps) >= 8


def test_conformance_plan_covers_every_golden_checkpoint() -> None:
    names = {s.name for s in plans.PLANS["conformance"].steps}
    assert {f"golden_{m}" for m in plans.goldens()} <= names and len(plans.goldens()) >= 12
    assert all((ROOT / "golden" / "checkpoints" / m).is_dir() for m in plans.goldens())
    assert all(s.alongside for s in plans.PLANS["conformance"].steps)


def test_runner_orders_steps_and_records_codes_timeouts_and_results(tmp_path: Path) -> None:
    py = "{python}"
    plan = Plan("fake", "a plan of tiny commands", (
        Step("slow_beside", (py, "-c", "import time; time.sleep(1); print('3 passed in 1.0s')"), 30, alongside=True),
        Step("ok", (py, "-c", "print('output tok/s 123'); print('noise')"), 30),
        Step("fails", (py, "-c", "import sys; print('1 failed, 2 passed'); sys.exit(1)"), 30),
        Step("hangs", (py, "-c", "import time; time.sleep(60)"), 2),
        Step("writes", (py, "-c", "import sys; open(sys.argv[1], 'w').write('x')", "{logs}/out.txt"), 30),
    ))
    rows = plans.run_plan(plan, tmp_path)
    assert [r["step"] for r in rows] == ["ok", "fails", "hangs", "writes", "slow_beside"]
    assert [r["rc"] for r in rows] == [0, 1, 124, 0, 0]
    assert rows[0]["result"] == "output tok/s 123" and rows[1]["result"] == "1 failed, 2 passed"
    assert rows[2]["result"] == "timeout" and rows[4]["result"] == "3 passed in 1.0s"
    assert (tmp_path / "out.txt").read_text() == "x" and (tmp_path / "fails.log").is_file()


def test_cli_lists_and_refuses_unknown_plans(tmp_path: Path, capsys) -> None:
    assert plans.main(["--list", "--logs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(f"{name}:" in out for name in plans.PLANS) and str(tmp_path) in out
    assert plans.main(["tp", "--dry-run", "--logs", str(tmp_path)]) == 0
    assert "--tp 2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        plans.main(["no-such-plan"])
    assert e.value.code == 2 and "unknown plan 'no-such-plan'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # listing runs nothing and writes nothing


def test_pack_puts_more_files_than_a_call_brings_back_into_one_archive(tmp_path: Path) -> None:
    import tarfile

    (tmp_path / "bench" / "run").mkdir(parents=True)
    names = [f"step{i}.log" for i in range(8)] + ["bench/run/0001.json"]
    for i, name in enumerate(names):
        (tmp_path / name).write_text(str(i))
    assert plans.pack(tmp_path, most=9) is None and len(list(tmp_path.rglob("*.*"))) == 9  # few enough: left
    archive = plans.pack(tmp_path)
    assert archive == tmp_path / "logs.tar.gz" and list(tmp_path.iterdir()) == [archive]
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(names)
        assert [tar.extractfile(n).read().decode() for n in names] == [str(i) for i in range(len(names))]
