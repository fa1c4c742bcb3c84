"""CPU engine settings: `LLM(cpu_threads=N)` sets torch's intra-op threads when the engine starts; the default
follows OMP_NUM_THREADS or the usable cores, shared among TP ranks and capped at hidden_size // 256. CPU TP
ranks fork from a forkserver that has the imports done; CUDA ranks keep spawn."""

from __future__ import annotations

import os

import pytest
import torch

from nanovllm_ref import LLM
from nanovllm_ref.config import auto_cpu_threads

from ..conftest import QWEN3, checkpoint_path


@pytest.fixture(autouse=True)
def _restore_threads():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def test_cpu_threads_is_applied_by_the_engine():
    LLM(str(checkpoint_path(QWEN3)), dtype="float32", device="cpu", cpu_threads=2)
    assert torch.get_num_threads() == 2
    LLM(str(checkpoint_path(QWEN3)), dtype="float32", device="cpu", cpu_threads=1)
    assert torch.get_num_threads() == 1


def test_auto_threads_follow_cores_ranks_and_model_size(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "32")
    assert auto_cpu_threads(hidden_size=4096, tp=1) == 16  # capped by the model: 4096 // 256
    assert auto_cpu_threads(hidden_size=8192, tp=1) == 32  # every core
    assert auto_cpu_threads(hidden_size=8192, tp=4) == 8  # the cores are shared by the ranks
    assert auto_cpu_threads(hidden_size=96, tp=1) == 1  # a tiny model: one thread
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert auto_cpu_threads(hidden_size=4096, tp=1) == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert auto_cpu_threads(hidden_size=1 << 20, tp=1) == len(os.sched_getaffinity(0))  # the usable cores


def test_cpu_tp_ranks_start_from_a_forkserver_cuda_ranks_are_spawned():
    import multiprocessing as mp
    import types

    from nanovllm_ref.engine.workers import worker_context

    expected = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    assert worker_context(types.SimpleNamespace(device="cpu")).get_start_method() == expected
    assert worker_context(types.SimpleNamespace(device="cuda")).get_start_method() == "spawn"
