"""Host-side engine loop with a fake model: scheduler + block manager + prepare_step, random next tokens.

This is the per-step CPU cost that sits between GPU forwards (nano-vllm's own scheduler + block manager:
267 us per step on the headline workload, measured on a 2-core CPU VM; its input preparation and sampling come on
top).
`NANOVLLM_REF_PERF_SLOW_HOST=1` also prepares each step's inputs twice (as if input preparation had doubled in
cost), a deliberate slow-down that shows the CPU regression gate tripping (perf/gate_demo.sh --cpu).
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

from nanovllm_ref import SamplingParams
from nanovllm_ref.engine.block_manager import BlockManager
from nanovllm_ref.engine.inputs import prepare_step
from nanovllm_ref.engine.scheduler import Scheduler
from nanovllm_ref.engine.sequence import Sequence
from nanovllm_ref.testing.bench.workloads import Workload

BLOCK_SIZE = 16


def slow_host() -> bool:
    return os.environ.get("NANOVLLM_REF_PERF_SLOW_HOST", "0") == "1"


@dataclass
class HostSim:
    scheduler: Scheduler
    vocab: int = 151936
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    token_pool: list[int] = field(default_factory=list)
    pool_pos: int = 0
    slow: bool = False
    last_host_s: float = 0.0
    steps: int = 0
    finished: int = 0
    stage_s: dict[str, float] = field(default_factory=lambda: {"schedule": 0.0, "prepare": 0.0, "update": 0.0})

    @classmethod
    def build(cls, workload: Workload, max_num_seqs: int = 256, max_num_batched_tokens: int = 16384,
              max_model_len: int = 8192, num_blocks: int | None = None, max_tokens: list[int] | None = None) -> HostSim:
        """A scheduler holding `workload`'s requests (outputs of `max_tokens` if given, else the workload's)."""
        if num_blocks is None:  # room for every request at full length: no preemption
            num_blocks = sum(-(-(len(p) + o) // BLOCK_SIZE) for p, o in zip(workload.prompts, workload.output_lens))
            num_blocks = 2 * num_blocks + 16
        bm = BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=True)
        sched = Scheduler(bm, max_num_seqs, max_num_batched_tokens, max_model_len)
        lens = max_tokens or workload.output_lens
        for i, (prompt, n) in enumerate(zip(workload.prompts, lens)):
            params = SamplingParams(temperature=workload.temperature, max_tokens=n, ignore_eos=True)
            sched.add(Sequence(str(i), prompt, params, seed=i))
        return cls(sched)

    def step(self, timed: bool = False) -> int:
        """One engine step with a fake model; returns the number of scheduled sequences."""
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        t1 = time.perf_counter()
        step = prepare_step(out, BLOCK_SIZE)
        if self.slow:
            prepare_step(out, BLOCK_SIZE)
        t2 = time.perf_counter()
        tokens = self._fake_tokens(len(step.sample_seq_ids))  # the model's output, as the runner gives it
        sampled = dict(zip(step.sample_seq_ids, tokens))
        t3 = time.perf_counter()
        self.finished += len(self.scheduler.update(out, sampled))
        if timed:
            t4 = time.perf_counter()
            self.stage_s["schedule"] += t1 - t0
            self.stage_s["prepare"] += t2 - t1
            self.stage_s["update"] += t4 - t3
            self.last_host_s = (t2 - t0) + (t4 - t3)  # scheduler + block manager + input preparation, no model
        self.steps += 1
        return len(out.scheduled)

    def __post_init__(self) -> None:
        self.slow = slow_host()
        self.token_pool = [self.rng.randrange(self.vocab) for _ in range(1 << 16)]

    def _fake_tokens(self, n: int) -> list[int]:
        """The fake model's next tokens: a fixed random pool drawn once and reused cyclically, so that drawing
        them is not timed as host work."""
        if self.pool_pos + n > len(self.token_pool):
            self.pool_pos = 0
        self.pool_pos += n
        return self.token_pool[self.pool_pos - n : self.pool_pos]

    def run_until_decode(self) -> None:
        """Step until every request is admitted and past its prefill (each step is then a pure decode)."""
        sched = self.scheduler
        while sched.waiting or any(s.num_computed_tokens < s.num_tokens - 1 for s in sched.running):
            self.step()

    def run_to_completion(self) -> int:
        while self.scheduler.has_unfinished():
            self.step()
        return self.steps
