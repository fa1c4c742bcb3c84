"""The device entry point: named plans of GPU work, each runnable in one call of a GPU machine.

    python -m perf.plans --list                       # the plans, each step's command and time limit
    python -m perf.plans headline                     # one plan
    python -m perf.plans headline conformance         # several, one after another
    python -m perf.plans tp --dry-run                 # print the commands only
    python -m perf.plans kernels --logs DIR           # logs and JSON into DIR

Plans (every command is a public tool of this repository; nothing here has numbers of its own):
- `headline`: nano-vllm's workload on Qwen3-0.6B, greedy and t=0.6, and greedy in `batch_invariant=True` mode (3 runs
  each, ceilings measured in the run), and batch-1 / batch-64 latency;
- `peers`: transformers' continuous batching on the same workload (perf/peers.py), plain and with CUDA graphs;
- `profile`: the step-time breakdown (perf/profile_step.py);
- `conformance`: `pytest conformance -m gpu`, every golden checkpoint of golden/manifest.json, the sampling
  module and the kernel module one kernel per process (each kernel nanovllm_ref.testing.kernels has a candidate
  of nanovllm_ref's for), side by side on the GPU (small KV budgets);
- `kernels`: the kernel benchmarks against this GPU's saved baseline with both gates (perf/README.md), the run
  saved as JSON; `baseline` records one on a GPU that has none;
- `mutants`: the GPU column of the mutation table (`python -m tools.mutants --gpu`);
- `fp8`: the headline with the FP8 KV cache and with bf16 KV in one perf-suite session (the fp8 headline's
  baseline saved: copy it into perf/baselines/headline/<gpu-slug>/), the fp8 step breakdown (perf/profile_step.py),
  the fp8 kernel tests compiled on the GPU, then the fp8-kv conformance tier on every golden checkpoint, side by
  side;
- `tp`: TP=1 against TP=2 on Qwen3-8B (the first 128 headline requests), TP=2 conformance, the perf suite's
  TP cases (needs two GPUs).
Logs go to `--logs` (default: `$OUT` when set, the folder a device call brings back; else the user cache folder);
a table at the end gives each step's exit code, time and result line. The exit code is 1 if any step failed. A call
brings back at most 8 files: when the run leaves more, they are packed into one `logs.tar.gz` there (`tar xzf`).
To make a run the tracked one, copy its figures into perf/RESULTS.md (and a gate's saved run into perf/baselines/).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from nanovllm_ref.testing.bench.tables import results_dir, text_table

ROOT = Path(__file__).resolve().parents[1]
PYTEST = ("{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE")
BENCH = ("{python}", "-m", "nanovllm_ref.testing.bench", "--arch", "qwen3-0.6b", "--workload", "headline")
FILES_BACK = 8  # the most files a device call brings back from $OUT
RESULT_LINE = re.compile(r"\b(passed|failed|error|caught|output tok/s|fraction of roofline|busy|rc=)\b", re.I)


@dataclass(frozen=True)
class Step:
    """One command ({python}, {logs} are filled in); `alongside`: it runs in the background, beside the next."""
    name: str
    argv: tuple[str, ...]
    timeout_s: int
    alongside: bool = False


@dataclass(frozen=True)
class Plan:
    name: str
    what: str
    steps: tuple[Step, ...]


def goldens() -> list[str]:
    """The golden checkpoints' names, from golden/manifest.json (new checkpoints join the plans by themselves)."""
    with open(ROOT / "golden" / "manifest.json") as f:
        return sorted(json.load(f)["checkpoints"])


def kernel_names() -> list[str]:
    """The kernels conformance/test_kernels.py checks nanovllm_ref's own candidates of (the one kernel list)."""
    from nanovllm_ref.testing.kernels import KERNELS, nanovllm_ref_candidates

    return [k for k in KERNELS if any(c.kernel == k for c in nanovllm_ref_candidates())]


def _gpu_conformance() -> tuple[Step, ...]:
    golden = tuple(Step(f"golden_{m}", (*PYTEST, "-m", "gpu", "conformance/test_golden.py", "--model", m,
                                         "--engine-arg", "gpu_memory_utilization=0.04",
                                         "--report", f"{{logs}}/report_{m}.json"), 300, alongside=True)
                   for m in goldens())
    sampling = Step("sampling", (*PYTEST, "-m", "gpu", "conformance/test_sampling.py", "--model", "qwen3-tiny",
                                 "--engine-arg", "gpu_memory_utilization=0.08", "--report", os.devnull), 300, True)
    kernels = tuple(Step(f"kernel_{k}", (*PYTEST, "-m", "gpu", "conformance/test_kernels.py", "-k", k, "--model",
                                         "qwen3-tiny", "--report", os.devnull), 300, alongside=True)
                    for k in kernel_names())
    return (*golden, sampling, *kernels)


def _fp8() -> tuple[Step, ...]:
    headline = Step("perf_headline_fp8", (*PYTEST, "perf/test_engine.py", "-m", "gpu", "-k", "test_headline_throughput",
                                          "--benchmark-storage=file://{logs}/benchmarks", "--benchmark-autosave",
                                          "--benchmark-json={logs}/perf_headline_fp8.json"), 240)
    profile = Step("profile_step_fp8", ("{python}", "-m", "perf.profile_step", "--arch", "qwen3-0.6b", "--temperature",
                                        "0", "--kv-cache-dtype", "fp8", "--json", "{logs}/profile_step_fp8.json"), 120)
    kernels = Step("fp8_kernel_tests", (*PYTEST, "tests/kernels/test_kernel_fp8_kv.py",  # compiled, on CUDA
                                        "tests/kernels/test_decode_attention_fp8.py", "-k", "not 16x6 and not 32x2"),
                   180)
    tier = tuple(Step(f"fp8kv_{m}", (*PYTEST, "-m", "gpu", "conformance/test_fp8_kv.py", "--model", m, "--engine-arg",
                                     "gpu_memory_utilization=0.04", "--torch-threads", "1", "--report", os.devnull),
                      200, alongside=True) for m in goldens())
    return (headline, profile, kernels, *tier)


def _kernel_gate(compare: bool) -> Step:
    gates = ("--benchmark-compare", "--event-compare-fail=10", "--benchmark-compare-fail=median:10%") if compare else ()
    return Step("perf_kernels", (*PYTEST, "perf/test_kernels.py", "-m", "gpu", *gates, "--benchmark-autosave",
                                 "--benchmark-json={logs}/perf_kernels.json"), 300)


def _tp() -> tuple[Step, ...]:
    bench = tuple(Step(f"tp{n}", ("{python}", "-m", "nanovllm_ref.testing.bench", "--arch", "qwen3-8b", "--workload",
                                  "headline", "--num-requests", "128", "--tp", str(n), "--repeat", "2",
                                  "--no-progress", "--json", f"{{logs}}/tp{n}.json"), 240) for n in (1, 2))
    conformance = tuple(Step(f"conformance_tp2_{m}", (*PYTEST, "-m", "gpu", "conformance/test_golden.py", "--tp", "2",
                                                      "--model", m, "--report", os.devnull), 200)
                        for m in ("qwen3-tiny", "qwen3-bias-hd32", "llama3-bias-hd32", "qwen3-moe-unnorm-hd32"))
    perf = Step("perf_tp", (*PYTEST, "perf/test_engine.py", "-m", "gpu", "-k", "tp_scaling", "--arch", "qwen3-8b",
                            "--benchmark-autosave", "--benchmark-json={logs}/perf_tp.json"), 400)
    return (*bench, *conformance, perf)


PLANS = {p.name: p for p in (
    Plan("headline", "the headline workload greedy and t=0.6, latency", (
        Step("headline_t0", (*BENCH, "--temperature", "0", "--repeat", "3", "--no-progress",
                             "--json", "{logs}/headline_t0.json"), 200),
        Step("headline_t0.6", (*BENCH, "--repeat", "3", "--no-progress", "--json", "{logs}/headline_t0.6.json"), 200),
        Step("headline_invariant_t0", (*BENCH, "--temperature", "0", "--batch-invariant", "--repeat", "3",
                                       "--no-progress", "--json", "{logs}/headline_invariant_t0.json"), 200),
        Step("latency", (*BENCH, "--mode", "latency", "--no-progress", "--json", "{logs}/latency.json"), 200))),
    Plan("peers", "transformers continuous batching on the headline workload", (
        Step("peer_hf-cb", ("{python}", "-m", "perf.peers", "--peer", "hf-cb", "--json", "{logs}/peer_hf-cb.json"),
             400),
        Step("peer_hf-cb_graphs", ("{python}", "-m", "perf.peers", "--peer", "hf-cb", "--cuda-graph",
                                   "--json", "{logs}/peer_hf-cb_graphs.json"), 400))),
    Plan("profile", "where a prefill, a mixed and a steady decode step spend their time", (
        Step("profile_step", ("{python}", "-m", "perf.profile_step", "--arch", "qwen3-0.6b", "--temperature", "0",
                              "--json", "{logs}/profile_step.json"), 250),)),
    Plan("conformance", "pytest conformance -m gpu: every golden, sampling, each kernel", _gpu_conformance()),
    Plan("kernels", "kernel benchmarks gated on this GPU's baseline (device time and wall time, 10%)",
         (_kernel_gate(compare=True),)),
    Plan("baseline", "record this GPU's first kernel baseline (no comparison)", (_kernel_gate(compare=False),)),
    Plan("mutants", "the GPU column of the mutation table", (
        Step("mutants_gpu", ("{python}", "-m", "tools.mutants", "--gpu", "--jobs", "16", "--timeout", "420",
                             "--budget", "480", "--out", "{logs}/mutants_gpu"), 540),)),
    Plan("fp8", "the headline with FP8 and bf16 KV (fp8 baseline saved), fp8 step profile, fp8 kernels, fp8-kv tier",
         _fp8()),
    Plan("tp", "TP=1 vs TP=2 (Qwen3-8B, 128 requests), TP=2 conformance, the perf TP cases", _tp()),
)}


def command(step: Step, logs: Path) -> list[str]:
    return [a.format(python=sys.executable, logs=logs) for a in step.argv]


def _result_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if RESULT_LINE.search(line)]
    return (lines[-1] if lines else (log.strip().splitlines() or [""])[-1])[:110]


class _Running:
    """One step's process, its log file and its start time."""

    def __init__(self, step: Step, logs: Path) -> None:
        self.step, self.path, self.t0 = step, logs / f"{step.name}.log", time.perf_counter()
        self.file = self.path.open("w")
        self.proc = subprocess.Popen(command(step, logs), cwd=ROOT, stdout=self.file, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait(self) -> dict[str, object]:
        try:
            code = self.proc.wait(timeout=max(1.0, self.step.timeout_s - (time.perf_counter() - self.t0)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = 124
        self.file.close()
        return {"step": self.step.name, "rc": code, "s": round(time.perf_counter() - self.t0),
                "result": "timeout" if code == 124 else _result_line(self.path.read_text(errors="replace"))}


def run_plan(plan: Plan, logs: Path) -> list[dict[str, object]]:
    """Run the steps in order; `alongside` ones start in the background and are waited for at the plan's end."""
    rows, background = [], []
    for step in plan.steps:
        running = _Running(step, logs)
        if step.alongside:
            background.append(running)
        else:
            rows.append(running.wait())
            print(f"{plan.name}/{step.name}: rc={rows[-1]['rc']} {rows[-1]['s']} s  {rows[-1]['result']}", flush=True)
    for running in background:
        rows.append(running.wait())
        print(f"{plan.name}/{running.step.name}: rc={rows[-1]['rc']} {rows[-1]['s']} s  {rows[-1]['result']}",
              flush=True)
    return rows


def pack(logs: Path, most: int = FILES_BACK) -> Path | None:
    """More than `most` files under `logs`: put them all into logs/logs.tar.gz (paths relative to `logs`) and remove
    them, so that a device call brings every log and JSON back as one file."""
    files = sorted(f for f in logs.rglob("*") if f.is_file())
    if len(files) <= most:
        return None
    archive = logs / "logs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(logs)))
    for f in files:
        f.unlink()
    for d in sorted((d for d in logs.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        d.rmdir()
    return archive


def _list(plans: list[Plan], logs: Path) -> None:
    for plan in plans:
        print(f"{plan.name}: {plan.what}")
        for step in plan.steps:
            where = "  (alongside)" if step.alongside else ""
            print(f"  {step.name} [{step.timeout_s} s]{where}: {' '.join(command(step, logs)[1:])}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.plans", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plans", nargs="*", metavar="PLAN", help=f"one or more of {sorted(PLANS)}")
    p.add_argument("--list", action="store_true", help="print the plans and their commands")
    p.add_argument("--dry-run", action="store_true", help="print the chosen plans' commands, run nothing")
    p.add_argument("--logs", default=None, help="folder for logs and JSON (default: $OUT, else the user cache)")
    args = p.parse_args(argv)
    unknown = [name for name in args.plans if name not in PLANS]
    if unknown or not (args.plans or args.list):
        p.error(f"unknown plan {unknown[0]!r}; known: {sorted(PLANS)}" if unknown else "name a plan (or --list)")
    logs = Path(args.logs or os.environ.get("OUT") or Path(results_dir()) / time.strftime("device-%Y%m%d-%H%M%S"))
    plans = [PLANS[name] for name in args.plans] or list(PLANS.values())
    if args.list or args.dry_run:
        _list(plans, logs)
        return 0
    logs.mkdir(parents=True, exist_ok=True)
    rows = [row for plan in plans for row in run_plan(plan, logs)]
    print(text_table(rows, ["step", "rc", "s", "result"]))
    archive = pack(logs)
    print(f"logs: {archive or logs}")
    return 1 if any(row["rc"] != 0 for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
