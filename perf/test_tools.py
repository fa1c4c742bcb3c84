"""Unit tests of the perf tooling: workloads, model shapes, roofline, baseline storage, CLIs and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nanovllm_ref.testing.bench import cli as bench_cli
from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.device import gpu_slug, percentile, slug
from nanovllm_ref.testing.bench.models import ARCHS, ModelShape, arch_config, model_folder, read_config
from nanovllm_ref.testing.bench.roofline import H200, H200_HEADLINE_ROOFLINE_S, decode_step_seconds, roofline
from perf import BASELINES_DIR, PERF_DIR, ceiling_row, peers, report


def test_headline_totals():
    w = workloads.headline()
    assert w.num_requests == 256
    assert w.prompt_tokens == workloads.HEADLINE_PROMPT_TOKENS == 142_827
    assert w.output_tokens == workloads.HEADLINE_OUTPUT_TOKENS == 133_966
    assert max(w.output_lens) == 1024 and all(100 <= len(p) <= 1024 for p in w.prompts)
    assert all(0 <= t <= 10000 for p in w.prompts for t in p)


def test_decode_contexts_follow_the_running_requests():
    w = workloads.headline()
    # every request decodes at least 100 steps; the longest output is 1,024, so one sequence runs at step 1,023
    assert workloads.decode_contexts(w, 0) == [len(p) + 1 for p in w.prompts]
    assert len(workloads.decode_contexts(w, 99)) == 256 and len(workloads.decode_contexts(w, 1023)) == 1
    total = sum(len(workloads.decode_contexts(w, s)) for s in range(1024))
    assert total == w.output_tokens  # one token per running request per step


def test_other_workloads():
    p = workloads.prefix_heavy()
    assert p.num_requests == 256 and all(q[:1024] == p.prompts[0][:1024] for q in p.prompts)
    s = workloads.smoke()
    assert s.num_requests == 8 and max(len(q) for q in s.prompts) <= 48 and max(s.output_lens) <= 12
    sub = workloads.headline().subset(10)
    assert sub.num_requests == 10 and sub.summary()["subset_requests"] == 10


def test_model_shapes():
    assert ModelShape.from_arch("qwen3-0.6b").num_params == 596_049_920  # Qwen3-0.6B's published parameter count
    assert ModelShape.from_arch("qwen3-0.6b").kv_bytes_per_token() == 114_688
    assert 8.1e9 < ModelShape.from_arch("qwen3-8b").num_params < 8.3e9
    assert 32.5e9 < ModelShape.from_arch("qwen3-32b").num_params < 33e9
    for arch in ARCHS:
        cfg = read_config(model_folder(arch))
        assert cfg == json.loads(json.dumps(arch_config(arch)))
        assert cfg["architectures"] == ["Qwen3ForCausalLM"]


def test_headline_roofline_matches_facts():
    w = workloads.headline()
    r = roofline(ModelShape.from_arch("qwen3-0.6b"), [len(p) for p in w.prompts], w.output_lens, H200)
    assert r.decode_steps == 1023
    assert abs(r.seconds - H200_HEADLINE_ROOFLINE_S) / H200_HEADLINE_ROOFLINE_S < 0.03
    assert 34_000 < r.output_tok_s < 37_000
    r2 = roofline(ModelShape.from_arch("qwen3-0.6b"), [len(p) for p in w.prompts], w.output_lens, H200, tp=2)
    assert r2.seconds == pytest.approx(r.seconds / 2)
    assert decode_step_seconds(ModelShape.from_arch("qwen3-0.6b"), 1, 0) == pytest.approx(1.192e9 / 4.25e12, 0.01)


def test_headline_roofline_with_fp8_kv():
    """1-byte KV halves the KV reads: the headline's H200 roofline falls from 3.72 s to 2.09 s (64,100 tok/s)."""
    w, shape = workloads.headline(), ModelShape.from_arch("qwen3-0.6b")
    lens = [len(p) for p in w.prompts]
    bf16, fp8 = roofline(shape, lens, w.output_lens, H200), roofline(shape, lens, w.output_lens, H200, kv_dtype_bytes=1)
    assert fp8.kv_read_bytes == pytest.approx(bf16.kv_read_bytes / 2) and fp8.weight_bytes == bf16.weight_bytes
    assert 62_000 < fp8.output_tok_s < 66_000


@pytest.mark.smoke
def test_bench_engine_fp8_kv_smoke(tmp_path):
    out = tmp_path / "r.json"
    assert bench_cli.main(["--arch", "tiny", "--workload", "smoke", "--device", "cpu", "--max-model-len", "256",
                              "--kv-cache-dtype", "fp8", "--no-ceilings", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["config"]["kv_cache_dtype"] == "fp8" and rec["throughput"]["output_tokens"] > 0


@pytest.mark.smoke
def test_bench_engine_batch_invariant_smoke(tmp_path):
    out = tmp_path / "r.json"
    assert bench_cli.main(["--arch", "tiny", "--workload", "smoke", "--device", "cpu", "--max-model-len", "256",
                           "--batch-invariant", "--no-ceilings", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["config"]["batch_invariant"] is True and rec["throughput"]["output_tokens"] > 0


def test_baseline_storage_is_per_device(pytestconfig):
    assert slug("NVIDIA H200") == "nvidia-h200" and slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    storage = getattr(pytestconfig.option, "benchmark_storage", None)
    if storage is None or BASELINES_DIR not in storage:
        pytest.skip("pytest-benchmark absent or --benchmark-storage given explicitly")
    assert storage == f"file://{BASELINES_DIR}/{gpu_slug()}"


def test_percentile():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0


@pytest.mark.smoke
def test_bench_cli_smoke(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = bench_cli.main(["--arch", "tiny", "--workload", "smoke", "--device", "cpu", "--mode", "all",
                            "--max-model-len", "256", "--latency-batches", "1,2", "--prompt-len", "16",
                            "--output-len", "3", "--latency-reps", "1", "--no-ceilings", "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["throughput"]["output_tokens"] == workloads.smoke().output_tokens
    assert [row["batch"] for row in rec["latency"]] == [1, 2]
    assert "fraction of roofline" in capsys.readouterr().out


def test_penalized_fraction_spreads_penalties_evenly(tmp_path):
    from nanovllm_ref.testing.bench.runner import params_for

    params = params_for(workloads.headline().with_penalties(0.1))
    marked = [i for i, p in enumerate(params) if p.uses_penalties]
    assert len(marked) == 25 and marked[:3] == [9, 19, 29]  # 10% of 256, every tenth
    assert not any(p.uses_penalties for p in params_for(workloads.headline()))
    out = tmp_path / "r.json"
    assert bench_cli.main(["--arch", "tiny", "--workload", "smoke", "--device", "cpu", "--max-model-len", "256",
                              "--penalized-fraction", "0.5", "--no-ceilings", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["throughput"]["workload"]["penalized_fraction"] == 0.5


@pytest.mark.smoke
def test_hf_static_peer_smoke():
    rec = peers.run_one(peers.parse_args(["--peer", "hf-static", "--arch", "tiny", "--workload", "smoke",
                                          "--device", "cpu", "--static-batch", "2", "--static-new-tokens", "3"]))
    assert rec["status"] == "ok", rec.get("error")
    assert rec["output_tokens"] == 6 and rec["output_tok_s"] > 0


def test_report(tmp_path):
    """GPU runs from nested result folders become rows (greedy and sampled apart); a CPU run adds none unless
    asked for, so a casual CPU bench cannot reach the tracked report."""
    results, baselines, out = tmp_path / "results", tmp_path / "baselines" / "cpu" / "Linux", tmp_path / "plots"
    (results / "gpu-x").mkdir(parents=True)
    baselines.mkdir(parents=True)
    gpu = {"gpu_name": "GPU X"}
    engine = {"kind": "engine", "arch": "tiny", "tp": 1, "device": "cuda", "machine": gpu, "timestamp": "t",
              "throughput": {"workload": {"workload": "smoke-8", "requests": 8, "temperature": 0.0},
                             "output_tok_s": 10.0, "total_tok_s": 20.0, "wall_s": 1.0, "steps": 5,
                             "roofline_fraction": 0.5, "roofline": {"output_tok_s": 20.0}}}
    sampled = json.loads(json.dumps(engine))
    sampled["throughput"]["workload"]["temperature"] = 0.6
    peer = {"kind": "peer", "engine": "hf-cb", "status": "ok", "arch": "tiny", "tp": 1, "output_tok_s": 5.0,
            "device": "cuda", "wall_s": 2.0, "workload": {"workload": "smoke-8[:4]", "requests": 4}, "machine": gpu}
    cpu = {**engine, "device": "cpu", "machine": {"gpu_name": "cpu"}}
    for name, record in (("gpu-x/a", engine), ("gpu-x/b", sampled), ("gpu-x/c", peer), ("casual_cpu", cpu)):
        (results / f"{name}.json").write_text(json.dumps(record))
    run = {"datetime": "2026", "machine_info": {"gpu_name": "cpu"}, "benchmarks": [
        {"name": "test_x", "group": "decode_attention", "stats": {"median": 1e-3},
         "extra_info": {"case": "decode-b1-ctx1", "gbps": 1.0, "fraction_of_ceiling": 0.5}}]}
    (baselines / "0001_x.json").write_text(json.dumps(run))
    args = ["--results", str(results), "--baselines", str(tmp_path / "baselines"), "--out", str(out), "--no-plots"]
    assert report.main(args) == 0
    md = (out / "report.md").read_text()
    assert "nanovllm_ref greedy" in md and "nanovllm_ref t=0.6" in md and "hf-cb" in md and "decode-b1-ctx1" in md
    assert "| cpu |" not in md
    assert report.main([*args, "--include-cpu"]) == 0
    assert "| cpu | nanovllm_ref greedy |" in (out / "report.md").read_text()


def test_throughput_chart_has_one_roofline_and_every_bar_labelled(tmp_path):
    pytest.importorskip("matplotlib")
    gpu = {"gpu_name": "GPU X"}
    engine = {"kind": "engine", "arch": "qwen3-0.6b", "tp": 1, "device": "cuda", "machine": gpu, "timestamp": "t",
              "throughput": {"workload": {"workload": "headline", "requests": 256, "temperature": 0.0},
                             "output_tok_s": 20000.0, "total_tok_s": 40000.0, "wall_s": 6.7, "steps": 1032,
                             "roofline_fraction": 0.55, "roofline": {"output_tok_s": 36000.0}}}
    sampled = json.loads(json.dumps(engine))
    sampled["throughput"]["workload"]["temperature"] = 0.6
    peer = {"kind": "peer", "engine": "hf-cb", "status": "ok", "arch": "qwen3-0.6b", "tp": 1, "output_tok_s": 640.0,
            "device": "cuda", "wall_s": 200.0, "workload": {"workload": "headline", "requests": 256}, "machine": gpu}
    for name, record in (("a", engine), ("b", sampled), ("c", peer)):
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    records = report.load_results(str(tmp_path))
    fig = report._throughput_chart(report._throughput_rows(records))
    ax = fig.axes[0]
    bars = [p for p in ax.patches if p.get_width() > 0]
    assert len(ax.get_lines()) == 1 and len(bars) >= 3  # one roofline; nanovllm_ref greedy, t=0.6 and a peer
    assert len(ax.texts) == len(bars) and ax.get_xlim()[1] > ax.get_lines()[0].get_xdata()[0]
    assert any("transformers" in t.get_text() for t in ax.get_yticklabels())


def test_hf_cb_peer_runs_on_cpu():
    """The transformers continuous-batching peer completes the smoke workload (so it cannot rot between GPU runs)."""
    args = peers.parse_args(["--peer", "hf-cb", "--arch", "tiny", "--workload", "smoke", "--device", "cpu"])
    record = peers.run_one(args)
    assert record["status"] == "ok", record.get("error")
    assert record["output_tokens"] == workloads.smoke().output_tokens


def test_ceiling_rows():
    kernel = {"case": "store_kv-t16384", "us_per_call_event": 39.2, "gbps": 3424.0, "fraction_of_ceiling": 0.803}
    assert ceiling_row("test_store_kv[16384]", kernel) == {
        "benchmark": "test_store_kv[16384]", "case": "store_kv-t16384", "us/call": 39.2, "rate": 3424.0,
        "unit": "GB/s", "of ceiling": "80.3%"}
    engine = {"output_tok_s": 21418.0, "roofline_fraction": 0.598}
    row = ceiling_row("test_headline", engine)
    assert (row["rate"], row["unit"], row["of ceiling"]) == (21418.0, "tok/s", "59.8%")
    assert ceiling_row("test_latency", {"ttft_p50_ms": 3.0}) is None


def test_perf_suite_prints_ceiling_fractions():
    """The closing summary lists each benchmark's case and fraction (the targets, printed by the suite)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--perf-smoke",
                          os.path.join(PERF_DIR, "test_kernels.py"), "-k", "store_kv_smoke or rmsnorm_smoke"],
                         capture_output=True, text=True, timeout=300, cwd=os.path.dirname(PERF_DIR))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = out.stdout.split("fraction of the measured ceilings")[1]
    assert "store_kv-t64" in summary and "rmsnorm-t32-h64" in summary and "GB/s" in summary


def test_store_kv_case_slot_layouts():
    """Engine layout: whole blocks of consecutive rows drawn from the pool; scattered: distinct random slots."""
    import torch

    from perf.kernel_bench import store_kv_case

    shape = ModelShape.from_arch("tiny")
    engine = store_kv_case(shape, 40, "cpu", torch.float32, block_size=8).sets[0][4]
    assert len(engine) == 40 and len(set(engine.tolist())) == 40
    blocks = (engine // 8).view(5, 8)  # 40 tokens fill 5 blocks of a 10-block pool
    assert (blocks == blocks[:, :1]).all() and (engine % 8).tolist() == list(range(8)) * 5
    assert len(set(blocks[:, 0].tolist())) == 5 and (engine < 2 * 40).all()
    scattered = store_kv_case(shape, 40, "cpu", torch.float32, block_size=8, scattered=True).sets[0][4]
    assert len(set(scattered.tolist())) == 40 and (scattered < 80).all()
    assert not ((scattered // 8).view(-1, 8) == (scattered // 8).view(-1, 8)[:, :1]).all()


@pytest.mark.gpu
def test_event_timing_excludes_launch_latency():
    """100 one-element adds: the GPU runs them faster than Python launches them, so with the spin kernel queued
    ahead the events must measure less than the host's enqueue time (without it they measure the launches)."""
    import time

    import torch

    from nanovllm_ref.testing.bench.device import time_fn

    x = torch.zeros(1, device="cuda")

    def launches() -> None:
        for _ in range(100):
            x.add_(1)

    time_fn(launches, 3, "cuda")
    t0 = time.perf_counter()
    launches()
    enqueue_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    assert min(time_fn(launches, 5, "cuda")) < 0.8 * enqueue_s


def test_cpu_ab_compares_two_trees_in_one_process(capsys):
    """perf/cpu_ab.py: the base revision's package imports under its new name beside this tree's, both engines
    run the workload, and the table comes out (one round of a small workload on the tiny checkpoint)."""
    from perf import cpu_ab

    cpu_ab.main(["--base", "HEAD", "--model", "qwen3-tiny", "--rounds", "1", "--prompts", "3", "--max-tokens", "4"])
    out = capsys.readouterr().out
    assert "greedy tokens equal" in out and "this tree" in out and "CPU-time speed-up per round" in out


def test_kept_baselines_hold_the_benchmarks_their_gates_compare():
    """The saved runs kept in git are what the gates compare against: the kernel run's benchmarks are
    test_kernels.py's, the headline run's test_engine.py's headline cases (a renamed benchmark would leave the gate
    comparing nothing)."""
    import ast
    import glob

    def names(pattern: str) -> set[str]:
        [path] = sorted(glob.glob(os.path.join(BASELINES_DIR, pattern)))[-1:]
        with open(path) as f:
            return {b["name"].split("[")[0] for b in json.load(f)["benchmarks"]}

    def tests_of(module: str) -> set[str]:
        with open(os.path.join(PERF_DIR, module)) as f:
            return {n.name for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.FunctionDef)}

    kernels = names("nvidia-h200/*/*.json")
    assert {"test_store_kv", "test_decode_attention", "test_prefill_attention"} <= kernels
    assert kernels <= tests_of("test_kernels.py")
    headline = names("headline/nvidia-h200/*/*.json")
    assert {"test_headline_throughput", "test_headline_throughput_fp8_kv"} <= headline <= tests_of("test_engine.py")
