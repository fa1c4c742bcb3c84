"""Tensor-parallel execution on one node: every rank runs in a spawned worker; the caller only schedules.

Ranks talk through torch.distributed (gloo on CPU, NCCL on GPU) with a rendezvous on a free port chosen at
start, and no process group lives in the caller: two engines coexist in one process tree. Each step the
caller pickles the StepInput once and sends it to every rank over its own pipe (no size cap, no
shared-memory names to clash); every rank runs the same forward; rank 0 samples. A step is "launched" on every
rank and "collected" from rank 0 (under async scheduling after the step behind it was launched): rank 0 broadcasts
its sampled tokens on the device, so every rank gathers the step behind's input ids from them (overlap.py's rows, sent
with that step) without the host. A worker that
raises reports "rank N: cause" and exits; the caller, which waits with a timeout and watches every worker,
raises that (or "rank N died") instead of hanging. Workers are daemons and are killed on shutdown.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import pickle
import socket
import time
import traceback
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..config import ModelConfig, RunnerSpec
from ..distributed import rank_kv_heads
from .inputs import StepInput
from .model_runner import Launched, ModelRunner, StepOutput

COLLECTIVE_TIMEOUT = timedelta(seconds=int(os.environ.get("NANOVLLM_REF_TP_TIMEOUT", "60")))
STARTUP_TIMEOUT_S = float(os.environ.get("NANOVLLM_REF_TP_STARTUP_TIMEOUT", "900"))


class WorkersFailed(RuntimeError):
    """The tensor-parallel workers are gone: the engine cannot go on (not one step's requests failing)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_context(spec: RunnerSpec) -> Any:
    """CPU ranks: forkserver where the OS has it, whose server imports torch and this package once per process tree,
    so a rank starts in ~0.1 s instead of re-importing them (5-15 s on a busy CPU; the conformance suite starts a
    dozen ranks; ranks get a ModelConfig, so they never import transformers). Ranks inherit the server's
    environment (from the first TP engine). CUDA ranks (and other OSes): spawn, each rank a fresh interpreter with
    the current environment."""
    if spec.device != "cpu" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["nanovllm_ref.engine.workers"])  # read when the server starts (the first TP engine)
    return ctx


def check_tp_size(model_config: ModelConfig, tp: int, device: str) -> None:
    rank_kv_heads(model_config.num_attention_heads, model_config.num_key_value_heads, 0, tp)  # (raises if unsplittable)
    if device == "cuda" and tp > torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size={tp} exceeds the {torch.cuda.device_count()} visible GPUs")


def _worker_main(rank: int, world: int, port: int, spec: RunnerSpec, model_config: ModelConfig,
                 conn: Connection) -> None:
    try:
        if spec.device == "cuda":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl" if spec.device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
            world_size=world, timeout=COLLECTIVE_TIMEOUT,
        )
        runner = ModelRunner(spec, model_config)
        conn.send(("ready", runner.num_kvcache_blocks))
        launched: dict[int, Launched] = {}  # steps launched and not yet collected, by the caller's key
        while (message := pickle.loads(conn.recv_bytes()))[0] != "exit":
            command, payload = message
            if command == "launch":  # queue a step; input ids may be gathered from an earlier one's tokens
                step, key, prev_key, rows = payload
                launched[key] = runner.launch(step, launched.get(prev_key), rows)
            else:  # collect: rank 0 waits for the step and answers; the others only forget it
                item = launched.pop(payload)
                if rank == 0:
                    conn.send(("output", runner.collect(item)))
    except (KeyboardInterrupt, EOFError):
        pass
    except BaseException as e:
        with suppress(Exception):  # (the caller may be gone)
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@dataclass(frozen=True)
class TPLaunched:
    """A step queued on every rank (TPExecutor.launch); the workers hold its tensors."""

    step: StepInput
    key: int


class TPExecutor:
    def __init__(self, spec: RunnerSpec, model_config: ModelConfig, tp: int) -> None:
        check_tp_size(model_config, tp, spec.device)
        ctx = worker_context(spec)
        port = free_port()
        self.conns: list[Connection] = []
        self.procs = []
        for rank in range(tp):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(rank, tp, port, spec, model_config, child), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self._closed = False
        self._next_key = 0
        atexit.register(self.shutdown)
        self.num_kvcache_blocks = self._receive(range(tp), STARTUP_TIMEOUT_S)[0]

    def _receive(self, ranks: range, timeout_s: float) -> list[Any]:
        """The next reply of each of `ranks`, in rank order. Every worker is watched meanwhile: an error it reports
        or its death raises WorkersFailed naming the rank, as does a reply missing after `timeout_s`."""
        replies: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(replies) < len(ranks):
            ready = wait([*self.conns, *(p.sentinel for p in self.procs)], max(0.0, deadline - time.monotonic()))
            if not ready:
                late = min(set(ranks) - set(replies))
                self._fail(f"tensor-parallel worker rank {late} did not answer within {timeout_s:.0f} s")
            for rank, (proc, conn) in enumerate(zip(self.procs, self.conns)):
                if conn in ready or proc.sentinel in ready:
                    kind, payload = "died", None  # (its sentinel, or its end of the pipe closed: the process is gone)
                    with suppress(EOFError, OSError):
                        if conn in ready:  # (a reply is read before the death that may follow)
                            kind, payload = conn.recv()
                    if kind in ("died", "error"):
                        why = f"failed: {payload}" if kind == "error" else f"died (exit code {proc.exitcode})"
                        self._fail(f"tensor-parallel worker rank {rank} {why}")
                    replies[rank] = payload
        return [replies[r] for r in ranks]

    def _fail(self, message: str) -> None:
        """Raise `message`, led by the root cause when it is another worker's death (its peers then fail
        in their collectives, and may report before the dead one is noticed)."""
        time.sleep(0.5)  # let a killed peer's exit status settle
        dead = [f"rank {r} died (exit code {p.exitcode})" for r, p in enumerate(self.procs)
                if p.exitcode not in (None, 0) and f"rank {r} died" not in message]
        self.shutdown(graceful=False)
        raise WorkersFailed(f"tensor-parallel worker {'; '.join(dead)}; then: {message}" if dead else message)

    def _send_all(self, message: tuple) -> None:
        if self._closed:
            raise WorkersFailed("the tensor-parallel workers were shut down")
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(data)
            except (BrokenPipeError, OSError):
                self._fail(f"tensor-parallel worker rank {rank} died (exit code {self.procs[rank].exitcode})")

    def launch(self, step: StepInput, prev: TPLaunched | None = None, rows: np.ndarray | None = None,
               draft_probs: None = None) -> TPLaunched:
        """Every rank queues the step (ModelRunner.launch) and keeps it; input ids gathered from `prev` (async
        scheduling, overlap.py) are its tokens, which rank 0 broadcast on the device when it sampled them.
        (`draft_probs` is always None: a draft model needs tensor_parallel_size 1, Config says; n-gram drafts are
        in the step.)"""
        self._next_key += 1
        self._send_all(("launch", (step, self._next_key, None if prev is None else prev.key, rows)))
        return TPLaunched(step, self._next_key)

    def collect(self, launched: TPLaunched) -> StepOutput:
        """Rank 0's output of a launched step (the other ranks forget it)."""
        self._send_all(("collect", launched.key))
        return self._receive(range(1), COLLECTIVE_TIMEOUT.total_seconds() * 2)[0]

    def shutdown(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if graceful:
            for conn in self.conns:
                with suppress(Exception):  # (a worker already gone)
                    conn.send_bytes(pickle.dumps(("exit", None)))
        for proc in self.procs:
            proc.join(timeout=10 if graceful else 0.5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        atexit.unregister(self.shutdown)
