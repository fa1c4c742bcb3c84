"""Turn saved runs into a markdown report and PNG plots: `python -m perf.report [--out perf/plots]`.

Inputs: pytest-benchmark runs saved under perf/baselines/** (kernel, engine and host-overhead benchmarks with
their `extra_info`; the newest run of each folder), and the JSON under perf/results/** written by `nanovllm-ref
bench` and `perf.peers` and copied there on purpose (the latest run per GPU; `--results DIR` reads another
folder, e.g. the user cache where bench writes by default). Runs on the CPU are left out unless `--include-cpu`:
the tracked report is the GPU's, and a casual CPU run must not add a row to it.
Outputs (in --out, default perf/plots/): report.md (also printed) and, when matplotlib is installed,
throughput.png (nanovllm_ref vs its peers on one workload and GPU, with that workload's roofline as one line and
each bar's value printed), kernels.png (each kernel's fraction of the measured ceiling), and tp_scaling.png only
when the results hold one engine at two or more tensor-parallel sizes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any

from nanovllm_ref.testing.bench.tables import markdown_table

from . import BASELINES_DIR, PLOTS_DIR, RESULTS_DIR


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_results(results_dir: str, include_cpu: bool = False) -> list[dict[str, Any]]:
    records = []
    for path in sorted(glob.glob(os.path.join(results_dir, "**", "*.json"), recursive=True)):
        r = _load(path)
        if r and r.get("kind") in ("engine", "peer") and (include_cpu or r.get("device") != "cpu"):
            r["_path"] = os.path.relpath(path, results_dir)
            records.append(r)
    return records


def load_benchmarks(baselines_dir: str) -> list[dict[str, Any]]:
    """One row per benchmark of the newest saved run of each (machine folder) under baselines_dir."""
    newest: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in glob.glob(os.path.join(baselines_dir, "**", "*.json"), recursive=True):
        run = _load(path)
        if not run or "benchmarks" not in run:
            continue
        folder = os.path.relpath(os.path.dirname(path), baselines_dir)
        if folder not in newest or run.get("datetime", "") > newest[folder][1].get("datetime", ""):
            newest[folder] = (path, run)
    rows = []
    for folder, (path, run) in sorted(newest.items()):
        gpu = run.get("machine_info", {}).get("gpu_name", "?")
        for b in run["benchmarks"]:
            rows.append({"source": folder, "file": os.path.basename(path), "gpu": gpu, "name": b["name"],
                         "group": b.get("group"), "median_s": b["stats"]["median"], **b.get("extra_info", {})})
    return rows


def _throughput_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    latest: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r["kind"] == "engine" and r.get("throughput"):
            t = r["throughput"]
            temperature = t["workload"].get("temperature")
            label = "nanovllm_ref" + (" eager" if r.get("enforce_eager") else "")
            label += " sync" if r.get("async_scheduling") is False else ""
            label += "" if temperature is None else (" greedy" if temperature == 0 else f" t={temperature:g}")
            row = {"engine": label, "arch": r.get("arch"),
                   "tp": r.get("tp"), "workload": t["workload"]["workload"], "requests": t["workload"]["requests"],
                   "output_tok_s": t["output_tok_s"], "total_tok_s": t["total_tok_s"], "wall_s": t["wall_s"],
                   "steps": t["steps"], "roofline_tok_s": t["roofline"]["output_tok_s"],
                   "roofline_fraction": t["roofline_fraction"]}
        elif r["kind"] == "peer" and r.get("status") == "ok":
            w = r.get("workload", {})
            row = {"engine": r["engine"], "arch": r.get("arch"), "tp": r.get("tp"),
                   "workload": r.get("workload_note") or w.get("workload"),
                   "requests": r.get("batch") or w.get("requests"), "output_tok_s": r["output_tok_s"],
                   "total_tok_s": r.get("total_tok_s"), "wall_s": r["wall_s"]}
        else:
            continue
        row.update(gpu=(r.get("machine") or {}).get("gpu_name"), when=r.get("timestamp"))
        key = (row["engine"], row["arch"], row["tp"], row["workload"], row["gpu"])
        if key not in latest or (row["when"] or "") >= (latest[key]["when"] or ""):
            latest[key] = row
    return sorted(latest.values(), key=lambda x: (x["gpu"] or "", x["workload"] or "", -x["output_tok_s"]))


def _latency_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in records:
        for lat in r.get("latency") or []:
            rows.append({"arch": r.get("arch"), "tp": r.get("tp"), "gpu": (r.get("machine") or {}).get("gpu_name"),
                         **{k: lat.get(k) for k in ("batch", "prompt_len", "output_len", "ttft_p50_ms", "ttft_p99_ms",
                                                    "tpot_p50_ms", "tpot_p99_ms")}, "when": r.get("timestamp")})
    return rows


KERNEL_COLS = ["source", "name", "case", "us_per_call_event", "us_per_call_wall", "gbps", "tflops",
               "fraction_of_ceiling"]
ENGINE_COLS = ["source", "name", "median_s", "output_tok_s", "total_tok_s", "steps", "roofline_fraction",
               "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"]
HOST_COLS = ["source", "name", "median_s", "mean_us_per_step", "p50_us_per_step", "us_per_step", "schedule_us",
             "prepare_us", "update_us"]


def build_markdown(records: list[dict[str, Any]], benches: list[dict[str, Any]]) -> str:
    parts = ["# nanovllm_ref performance report", ""]
    thr = _throughput_rows(records)
    parts += ["## Throughput (perf/results: nanovllm-ref bench and perf.peers)", "",
              markdown_table(thr, ["gpu", "engine", "arch", "tp", "workload", "requests", "output_tok_s",
                                   "total_tok_s", "wall_s", "steps", "roofline_tok_s", "roofline_fraction"]), ""]
    lat = _latency_rows(records)
    if lat:
        parts += ["## Latency (nanovllm-ref bench --mode latency)", "", markdown_table(lat), ""]
    groups = {
        "Kernels (fraction of the measured copy / matmul ceiling)": (
            [b for b in benches if "case" in b], KERNEL_COLS),
        "Engine benchmarks (pytest perf)": ([b for b in benches if (b.get("group") or "").startswith(
            ("engine", "smoke-engine"))], ENGINE_COLS),
        "Host overhead (CPU, fake model)": ([b for b in benches if b.get("group") == "host_overhead"], HOST_COLS),
    }
    for title, (rows, cols) in groups.items():
        if rows:
            parts += [f"## {title}", "", markdown_table(rows, cols), ""]
    if not thr and not benches:
        parts += ["_No saved runs found: run `nanovllm-ref bench` or `pytest perf --benchmark-autosave`._"]
    return "\n".join(parts)


def make_plots(records: list[dict[str, Any]], benches: list[dict[str, Any]], out: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        print("matplotlib is not installed: skipping plots (pip install matplotlib)")
        return []
    written = []
    chart = _throughput_chart(_throughput_rows(records))
    if chart:
        written.append(_save(chart, out, "throughput.png"))
    for name, chart in (("kernels.png", _kernels_chart(benches)), ("tp_scaling.png", _tp_chart(records, benches))):
        if chart:
            written.append(_save(chart, out, name))
    return written


def _kernels_chart(benches: list[dict[str, Any]]) -> Any:
    import matplotlib.pyplot as plt

    kern = [b for b in benches if "fraction_of_ceiling" in b]
    if not kern:
        return None
    gpus = sorted({b["gpu"] for b in kern})
    labels = [b["case"] if len(gpus) == 1 else f"{b['case']} [{b['gpu']}]" for b in kern]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(kern) + 1.5))
    bars = ax.barh(labels, [b["fraction_of_ceiling"] for b in kern], color="tab:green")
    ax.bar_label(bars, labels=[f"{100 * b['fraction_of_ceiling']:.0f}%" for b in kern], padding=3, fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(0, max(1.2, max(b["fraction_of_ceiling"] for b in kern) * 1.15))
    ax.set_xlabel("fraction of the ceiling measured in the run (copy bandwidth; prefill: matmul rate)")
    ax.set_title("Kernels" + (f" on {gpus[0]}" if len(gpus) == 1 else ""))
    return fig


def _tp_chart(records: list[dict[str, Any]], benches: list[dict[str, Any]]) -> Any:
    """Output tok/s against the tensor-parallel size, for each engine measured at two sizes or more (else None)."""
    import matplotlib.pyplot as plt

    tp: dict[tuple, dict[int, float]] = {}
    for r in _throughput_rows(records):
        tp.setdefault((r["engine"], r["arch"], r["workload"]), {})[r["tp"] or 1] = r["output_tok_s"]
    for b in benches:
        if b.get("group") == "engine_tp" and "output_tok_s" in b:
            tp.setdefault(("pytest", b["source"], b.get("workload")), {})[b.get("tp", 1)] = b["output_tok_s"]
    tp = {k: v for k, v in tp.items() if len(v) > 1}
    if not tp:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for (engine, arch, workload), pts in tp.items():
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", label=f"{engine} {arch} {workload}")
    ax.set_xlabel("tensor_parallel_size")
    ax.set_ylabel("output tok/s")
    ax.set_title("TP scaling")
    ax.legend(fontsize=7)
    return fig


PEER_LABELS = {"hf-cb": "transformers continuous batching", "hf-static": "transformers generate",
               "vllm": "vLLM", "sglang": "SGLang"}


def _throughput_chart(rows: list[dict[str, Any]]) -> Any:
    """Bars of one GPU and workload (the newest nanovllm_ref run's), peers included, each value printed at its
    bar's end, and that run's roofline as the one vertical line; the legend sits below the axes, over no bar."""
    import matplotlib.pyplot as plt

    engines = [r for r in rows if r.get("roofline_tok_s") and r["tp"] in (1, None)]
    if not engines:
        return None
    newest = max(engines, key=lambda r: r["when"] or "")
    same = [r for r in rows if (r["gpu"], r["workload"], r["arch"]) == (newest["gpu"], newest["workload"],
                                                                       newest["arch"]) and r["tp"] in (1, None)]
    same.sort(key=lambda r: r["output_tok_s"])
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(same) + 2.2))
    colors = ["tab:blue" if r["engine"].startswith("nanovllm_ref") else "tab:gray" for r in same]
    bars = ax.barh([PEER_LABELS.get(r["engine"], r["engine"]) for r in same], [r["output_tok_s"] for r in same],
                   color=colors)
    ax.bar_label(bars, labels=[f"{r['output_tok_s']:,.0f}" for r in same], padding=3)
    roof = newest["roofline_tok_s"]
    ax.axvline(roof, color="tab:red", linestyle="--", label=f"roofline {roof:,.0f} tok/s (memory bound, this GPU)")
    ax.set_xlim(0, roof * 1.12)
    ax.set_xlabel("output tok/s")
    ax.set_title(f"{newest['workload']} workload, {newest['arch']}, {newest['gpu']}")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    return fig


def _save(fig: Any, out: str, name: str) -> str:
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m perf.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=RESULTS_DIR)
    p.add_argument("--baselines", default=BASELINES_DIR)
    p.add_argument("--out", default=PLOTS_DIR)
    p.add_argument("--markdown", default=None, help="where to write the markdown (default: OUT/report.md)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--include-cpu", action="store_true", help="also the runs made on a CPU")
    args = p.parse_args(argv)
    records, benches = load_results(args.results, args.include_cpu), load_benchmarks(args.baselines)
    os.makedirs(args.out, exist_ok=True)
    md = build_markdown(records, benches)
    with open(args.markdown or os.path.join(args.out, "report.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    if not args.no_plots:
        for path in make_plots(records, benches, args.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
