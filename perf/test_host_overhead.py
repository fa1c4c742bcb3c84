"""Host overhead on the CPU: scheduler + block manager + prepare_step per step, with a fake model.

- `test_decode_step_256`: 256 running requests in steady decode (prompts from the headline workload), one
  step per round. The benchmark's own time is the whole step, the fake model's output dict included; `extra_info`
  has mean / p50 / p99 us per step of scheduler + block manager + input preparation alone (the issue-7 metric:
  target 250 us) and its split between schedule, prepare_step and update. Anchor: nano-vllm's scheduler + block
  manager, 267 us per step (measured on the 2-core CPU VM, perf/RESULTS.md).
- `test_headline_schedule`: the whole headline workload through the host loop (every prefill chunk and
  decode step), as the anchor measured: seconds per run and us per step.
- `test_prefill_step_inputs`: the headline's first two steps (16,384 tokens each: 32 prompts, then prompt chunks
  next to decodes): prepare_step and the eager runner's staging of the forward's inputs (`stage_step`, one
  host-to-device copy; on the CPU the copy is a no-op), the host work of a prefill step before its kernels.
- `test_tp_wire_decode_256`: the tensor-parallel control plane's host cost of a steady decode step at 256 running
  requests: pickling the StepInput as the caller sends it to every rank, and unpickling it as a worker does
  (engine/workers.py; the block tables travel as one int32 array, StepInput.block_tables).
Runs on every machine (CPU work); `NANOVLLM_REF_PERF_SLOW_HOST=1` slows it on purpose (perf/gate_demo.sh --cpu).
"""

from __future__ import annotations

import pickle
import statistics

import numpy as np
import pytest
import torch

from nanovllm_ref.engine.inputs import prepare_step
from nanovllm_ref.engine.staging import stage_step
from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.device import percentile
from perf.host_sim import BLOCK_SIZE, HostSim

NANO_VLLM_US_PER_STEP = 267.0
DECODE_ROUNDS, DECODE_WARMUP = 200, 20


@pytest.fixture(scope="module")
def headline() -> workloads.Workload:
    return workloads.headline()


def test_decode_step_256(benchmark, headline):
    sim = HostSim.build(headline, max_tokens=[2000] * headline.num_requests)  # nobody finishes while timed
    sim.run_until_decode()
    assert len(sim.scheduler.running) == 256 and not sim.scheduler.waiting
    benchmark.group = "host_overhead"
    benchmark.pedantic(sim.step, rounds=DECODE_ROUNDS, warmup_rounds=DECODE_WARMUP, iterations=1)
    assert sim.finished == 0
    # a second pass with per-stage timers, for the breakdown
    host_us = []
    sim.stage_s = dict.fromkeys(sim.stage_s, 0.0)
    for _ in range(DECODE_ROUNDS):
        assert sim.step(timed=True) == 256
        host_us.append(sim.last_host_s * 1e6)
    benchmark.extra_info.update(
        running_requests=256, mean_us_per_step=statistics.fmean(host_us), p50_us_per_step=percentile(host_us, 50),
        p99_us_per_step=percentile(host_us, 99), nano_vllm_anchor_us=NANO_VLLM_US_PER_STEP,
        **{f"{k}_us": v / DECODE_ROUNDS * 1e6 for k, v in sim.stage_s.items()},
    )


def test_headline_schedule(benchmark, headline):
    def setup():
        return (HostSim.build(headline),), {}

    sims: list[HostSim] = []

    def run(sim: HostSim) -> int:
        sims.append(sim)
        return sim.run_to_completion()

    benchmark.group = "host_overhead"
    benchmark.pedantic(run, setup=setup, rounds=3, warmup_rounds=0)
    sim = sims[-1]
    assert sim.finished == headline.num_requests
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    info = {"steps": sim.steps, "requests": headline.num_requests}
    if stats is not None:
        info.update(seconds=stats.median, us_per_step=stats.median / sim.steps * 1e6,
                    nano_vllm_anchor_us=NANO_VLLM_US_PER_STEP, nano_vllm_anchor_steps=1032)
    benchmark.extra_info.update(info)


@pytest.mark.parametrize("index", [0, 1], ids=["prefill", "mixed"])
def test_prefill_step_inputs(benchmark, headline, index):
    sim = HostSim.build(headline)
    for _ in range(index):
        sim.step()
    out = sim.scheduler.schedule()
    assert out.num_batched_tokens == 16384
    cpu = torch.device("cpu")

    def inputs() -> int:
        step = prepare_step(out, BLOCK_SIZE)
        return stage_step(step, cpu, 8192)[0].numel()

    benchmark.group = "host_overhead"
    assert benchmark.pedantic(inputs, rounds=30, warmup_rounds=3, iterations=1) == 16384
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    benchmark.extra_info.update(tokens=16384, sequences=len(out.scheduled),
                                **({"us_per_step": stats.median * 1e6} if stats is not None else {}))


def test_tp_wire_decode_256(benchmark, headline):
    sim = HostSim.build(headline, max_tokens=[2000] * headline.num_requests)
    sim.run_until_decode()
    for _ in range(300):  # contexts ~300 tokens past the prompts: ~40 blocks per sequence
        sim.step()
    step = prepare_step(sim.scheduler.schedule(), BLOCK_SIZE)
    assert len(step.seq_lens) == 256 and step.block_tables.dtype == np.int32

    def round_trip() -> int:  # the caller's dumps (once per step) and one worker's loads
        data = pickle.dumps(("launch", (step, 1, 0, None, None)), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)
        return len(data)

    benchmark.group = "host_overhead"
    nbytes = benchmark.pedantic(round_trip, rounds=50, warmup_rounds=5, iterations=1)
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    benchmark.extra_info.update(bytes_per_step=nbytes, block_table_width=step.block_tables.shape[1],
                                **({"us_per_step": stats.median * 1e6} if stats is not None else {}))
