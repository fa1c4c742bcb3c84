"""Tensor-parallel execution on one node: rank 0 in the caller's process, ranks > 0 spawned.

Ranks talk through torch.distributed: gloo on CPU, NCCL on GPU, rendezvous on a free port chosen at start
(two engines coexist). Each step, rank 0 broadcasts the StepInput as a pickled object on a gloo group
(no size cap, no shared-memory names to clash); every rank runs the same forward; rank 0 samples.
A worker that raises reports "rank N: cause" on an error queue and exits; rank 0's next collective then
fails and the caller gets that report. Workers are daemons, so no process outlives the caller.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import queue
import socket
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .inputs import StepInput
from .model_runner import ModelRunner, RunnerSpec, StepOutput

COLLECTIVE_TIMEOUT = timedelta(seconds=int(os.environ.get("NANOVLLM_REF_TP_TIMEOUT", "60")))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_tp_size(hf_config: Any, tp: int, device: str) -> None:
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if heads % tp:
        raise ValueError(f"tensor_parallel_size={tp} must divide num_attention_heads={heads}")
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(f"tensor_parallel_size={tp} and num_key_value_heads={kv_heads}: one must divide the other")
    if device == "cuda" and tp > torch.cuda.device_count():
        raise ValueError(f"tensor_parallel_size={tp} exceeds the {torch.cuda.device_count()} visible GPUs")


def _init_rank(rank: int, world: int, port: int, device: str) -> dist.ProcessGroup:
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT
    )
    return dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT) if backend == "nccl" else dist.group.WORLD


def _worker_main(rank: int, world: int, port: int, spec: RunnerSpec, hf_config: Any, errors: mp.Queue) -> None:
    try:
        control = _init_rank(rank, world, port, spec.device)
        runner = ModelRunner(spec, hf_config)
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0, group=control)
            command, arg = box[0]
            if command == "exit":
                break
            runner.execute(arg)
    except KeyboardInterrupt:
        pass
    except BaseException as e:  # report, then exit: rank 0 learns of it when its next collective fails
        errors.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class TPExecutor:
    def __init__(self, spec: RunnerSpec, hf_config: Any, tp: int) -> None:
        check_tp_size(hf_config, tp, spec.device)
        ctx = mp.get_context("spawn")
        self.errors: mp.Queue = ctx.Queue()
        port = free_port()
        self.procs = [
            ctx.Process(target=_worker_main, args=(r, tp, port, spec, hf_config, self.errors), daemon=True)
            for r in range(1, tp)
        ]
        for p in self.procs:
            p.start()
        self._closed = False
        atexit.register(self.shutdown)
        try:
            self.control = _init_rank(0, tp, port, spec.device)
            self.runner = ModelRunner(spec, hf_config)
        except Exception as e:
            self._raise_worker_error(e)
        self.num_kvcache_blocks = self.runner.num_kvcache_blocks

    def _broadcast(self, command: str, arg: Any = None) -> None:
        dist.broadcast_object_list([(command, arg)], src=0, group=self.control)

    def execute(self, step: StepInput) -> StepOutput:
        try:
            self._broadcast("execute", step)
            return self.runner.execute(step)
        except Exception as e:
            self._raise_worker_error(e)

    def _raise_worker_error(self, cause: Exception) -> None:
        try:
            rank, message = self.errors.get(timeout=5)
            detail = f"tensor-parallel worker rank {rank} failed: {message}"
        except queue.Empty:
            dead = [i + 1 for i, p in enumerate(self.procs) if not p.is_alive()]
            who = f"worker rank(s) {dead} died (exit codes {[self.procs[r - 1].exitcode for r in dead]})" if dead else (
                "rank 0 failed"
            )
            detail = f"tensor-parallel {who}: {type(cause).__name__}: {cause}"
        self.shutdown(graceful=False)
        raise RuntimeError(detail) from cause

    def shutdown(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if graceful and all(p.is_alive() for p in self.procs):
            try:
                self._broadcast("exit")
            except Exception:
                pass
        for p in self.procs:
            p.join(timeout=10 if graceful else 1)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        if getattr(self, "runner", None) is not None:
            self.runner.shutdown()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        atexit.unregister(self.shutdown)
