"""Tests of perf/profile_step.py and perf/step_trace.py: kernel classes, step attribution of a Kineto trace, the
breakdown's sums, and one unprofiled + profiled pass of the tiny model on the CPU (the GPU run is the tool itself)."""

from __future__ import annotations

import pytest

from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.device import has_cuda
from perf import profile_step as ps
from perf import step_trace as st


def test_classify_by_name_and_range():
    assert st.classify("_decode_split_kernel", []) == "attention"
    assert st.classify("_store_kv_kernel", []) == "kv store"
    assert st.classify("_qkv_epilogue_kernel", []) == "qk-norm+rope+kv"
    assert st.classify("_rms_norm_kernel", ["nvr_step#3"]) == "norms"
    assert st.classify("nvjet_tst_128x64_64x4_1x2_h_bz_coopA_TNT", ["nvr_step#3"]) == "gemm"
    assert st.classify("sm90_xmma_gemm_bf16bf16_bf16f32", ["nvr_step#1", "lm_head"]) == "lm_head"
    assert st.classify("_gumbel_argmax_kernel", ["nvr_step#1", "sampler"]) == "sampler"
    assert st.classify("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", []) == "all-reduce"
    assert st.classify("void at::native::vectorized_elementwise_kernel", []) == "other"


def _trace() -> dict:
    """Two host steps on one thread; step 0 launches a graph (two kernels) and an LM head, step 1 one kernel."""
    ev = []

    def annot(name, ts, dur):
        ev.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "tid": 1})

    def launch(corr, ts, cat="cuda_runtime"):
        ev.append({"ph": "X", "cat": cat, "name": "launch", "ts": ts, "dur": 1, "tid": 1,
                   "args": {"correlation": corr}})

    def kernel(corr, name, ts, dur, cat="kernel"):
        ev.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": 7, "args": {"correlation": corr}})

    annot("nvr_step#0", 0, 50)
    annot("lm_head", 20, 10)
    launch(1, 5)
    kernel(1, "_rms_norm_kernel", 100, 10)
    kernel(1, "_decode_split_kernel", 112, 30)  # 2 us gap after the norm
    launch(2, 25, "cuda_driver")
    kernel(2, "nvjet_gemm", 142, 8)
    annot("nvr_step#1", 60, 50)
    launch(3, 70)
    kernel(3, "_store_kv_kernel", 160, 5)  # 10 us idle between the steps
    kernel(3, "memcpy", 165, 1, cat="gpu_memcpy")
    kernel(99, "_rms_norm_kernel", 170, 5)  # launched outside any step: ignored
    return {"traceEvents": ev}


def test_kernels_by_step_and_breakdown_add_up():
    kernels = st.kernels_by_step(_trace())
    assert sorted(kernels) == [0, 1]
    assert [k[2] for k in sorted(kernels[0])] == ["norms", "attention", "lm_head"]
    assert sorted(kernels[0])[2][3] == "nvjet_gemm"
    assert [k[2] for k in sorted(kernels[1])] == ["kv store", "copies"]
    parts = st.breakdown(kernels, [0, 1])  # step 1 has no successor: only step 0 is counted
    assert parts["steps"] == 1
    assert parts["period"] == pytest.approx(60.0)
    assert parts["norms"] == 10 and parts["attention"] == 30 and parts["lm_head"] == 8
    assert parts["gaps inside the step"] == pytest.approx(2.0)
    assert parts["idle between steps (host)"] == pytest.approx(10.0)
    summed = sum(v for k, v in parts.items() if k not in ("period", "steps"))
    assert summed == pytest.approx(parts["period"])
    assert st.top_kernels(kernels, [0, 1])[0] == ("_decode_split_kernel", 0.5, 15.0)
    assert st.top_gaps(kernels, [0]) == [("_rms_norm_kernel -> _decode_split_kernel", 1.0, 2.0)]


def test_bounds_are_bytes_over_bandwidth():
    from nanovllm_ref.testing.bench.models import ModelShape

    shape = ModelShape.from_arch("qwen3-0.6b")
    b = st.decode_bounds(shape, batch=256, context=256_000, copy_gbps=4000.0)
    assert b["attention"] == pytest.approx(256_000 * 114_688 / 4e12 * 1e6)
    assert b["lm_head"] == pytest.approx(151_936 * 1024 * 2 / 4e12 * 1e6)


@pytest.mark.skipif(has_cuda(), reason="the CPU pass; on a GPU the tool runs whole")
def test_cpu_pass_steps_and_timings():
    llm = ps.build_llm("tiny", device="cpu", async_scheduling=True)  # (the GPU default; the CPU asks for it)
    try:
        ps._instrument(llm)
        w = workloads.smoke(num_requests=4, max_prompt=24, max_output=12)
        plain = ps.run_pass(llm, w, first=2, skip=1, window=3, profile=False)
        assert [s["index"] for s in plain["steps"]] == list(range(6)) and plain["window_ms"] > 0
        assert plain["steps"][0]["tokens"] == sum(len(p) for p in w.prompts)  # all prompts fit the first step
        assert not llm.has_unfinished()  # the pass aborted what it added
        phases = ps.HostPhases(llm)
        ps.run_pass(llm, w, first=2, skip=1, window=3, profile=False, phases=phases)
        phases.restore()
        host = phases.per_step_us(3)
        assert host["launch"] >= host["compute_hidden"] > 0 and host["_schedule"] > 0
        assert "collect" not in llm.engine.runner.__dict__ and "launch" not in llm.engine.runner.__dict__
        prof = ps.run_pass(llm, w, first=2, skip=1, window=3, profile=True)
        names = {e.get("name") for e in prof["trace"]["traceEvents"]}
        assert {"nvr_step#0", "nvr_step#5", "lm_head", "sampler"} <= names
    finally:
        llm.engine.shutdown()
