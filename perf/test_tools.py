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
from perf import peers, report
from perf.tables import BASELINES_DIR, PERF_DIR, ceiling_row


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


def test_invariant_attention_prefill_steps_pack_the_headline_prompts():
    """perf/invariant_attention.py's prefill steps: every prompt token once, in order, chunks contiguous, steps full
    up to the budget except the last."""
    from perf.invariant_attention import BUDGET, prefill_steps

    w = workloads.headline()
    steps = prefill_steps(w)
    assert [sum(t for _, _, t in s) for s in steps[:-1]] == [BUDGET] * (len(steps) - 1)
    assert sum(t for s in steps for _, _, t in s) == workloads.HEADLINE_PROMPT_TOKENS
    seen = [0] * len(w.prompts)
    for i, first, tokens in (chunk for s in steps for chunk in s):
        assert first == seen[i] and tokens > 0
        seen[i] += tokens
    assert seen == [len(p) for p in w.prompts]


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
    records = report.load_results(os.path.join(PERF_DIR, "results"))
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


def test_ncu_decode_reads_ncu_csv_and_tiles():
    from perf.fp8_decode_sweep import parse_tile
    from perf.ncu_decode import _number, parse_details

    out = ('==PROF== Connected to process 1\n'
           '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
           '"0","_decode_split_kernel","SpeedOfLight","Duration","us","90.08"\n'
           '"0","_decode_split_kernel","","smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","inst","1,020.5"\n')
    m = parse_details(out)
    assert m["Duration"] == "90.08 us"
    assert _number(m["smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"]) == 1020.5
    assert parse_tile("32/1/8/s") == (True, {"BLOCK_N": 32, "num_warps": 1, "num_stages": 8, "SWAP": True})
    assert parse_tile("bf16:64/2/4/r128") == (False, {"BLOCK_N": 64, "num_warps": 2, "num_stages": 4, "maxnreg": 128})
    assert parse_tile("g:32/3") == (True, {"GLUON": 1, "BLOCK_N": 32, "STAGES": 3})


def test_ncu_decode_prints_stalls_and_bank_conflicts(monkeypatch, capsys):
    from perf import ncu_decode

    counters = {"Duration": "90.08 us", ncu_decode.STALL.format("short_scoreboard"): "2.02 inst",
                ncu_decode.STALL.format("wait"): "0.01 inst", ncu_decode.CONFLICTS.format("st"): "3,398,496",
                ncu_decode.WAVEFRONTS.format("st"): "6,026,792"}
    monkeypatch.setattr(ncu_decode, "profile", lambda step, tile: counters)
    assert ncu_decode.main(["--step", "320", "--tiles", "32/1/8/s"]) == 0
    out = capsys.readouterr().out
    assert "== step 320 tile 32/1/8/s" in out and "90.08 us" in out
    stalls = next(line for line in out.splitlines() if "stalls" in line)
    assert "short_scoreboard 2.02" in stalls and "wait" not in stalls  # below 0.05 cycles: left out
    assert "shared stores: 6,026,792 wavefronts, 3,398,496 of them bank conflicts" in out
    assert "shared loads : ? wavefronts, ? of them bank conflicts" in out


def test_prefill_tiles_shapes_and_the_sm90_tile():
    import torch

    from nanovllm_ref.kernels.prefill_attention import prefill_tile_config
    from perf.prefill_tiles import headline_lens, shapes

    lens = headline_lens()
    assert sum(lens) == 16384 and len(lens) == 32 and all(n > 0 for n in lens)
    assert all(heads % 8 == 0 and d in (64, 128) for _, heads, d in shapes().values())
    # on sm_90 the 128-row tiles take the swept tile; 64-row tiles (fp32, head_dim > 128) and other GPUs do not
    sm90 = prefill_tile_config(128, torch.bfloat16, 2, 1024, sm90=True)
    assert sm90 == {"BLOCK_Q": 64, "BLOCK_G": 2, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    assert prefill_tile_config(128, torch.bfloat16, 2, 1024)["BLOCK_N"] == 32
    assert prefill_tile_config(256, torch.bfloat16, 2, 1024, sm90=True)["BLOCK_N"] == 32
    assert prefill_tile_config(128, torch.float32, 2, 1024, sm90=True)["BLOCK_N"] == 32


def test_graph_launch_gaps_from_a_trace():
    from perf.graph_launch import graph_gaps

    def op(name, ts, dur, corr, cat="kernel"):
        return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    events = [{"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 300, "args": {"correlation": 7}},
              {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 400, "dur": 200, "args": {"correlation": 9}},
              op("Memcpy DtoD", 1000, 2, 5, "gpu_memcpy"), op("embed", 1010, 5, 7), op("norm", 1016, 3, 7),
              op("copy", 1020, 1, 8), op("embed", 1025, 5, 9), op("norm", 1032, 2, 9)]
    r = graph_gaps(events)
    assert r["gap_before_us"] == (6, 4, 8)  # 1010 - 1002 and 1025 - 1021: median of the two
    assert r["after"] == ["Memcpy DtoD", "copy"] and r["host_launch_us"] == 250
    assert r["inner_gap_us"] == 1.5  # (1016 - 1015) and (1032 - 1030)
