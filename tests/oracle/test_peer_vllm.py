"""vLLM as a real peer (only where vLLM is installed, e.g. the `nox -s peer-vllm` venv; skipped elsewhere):
`VLLMAdapter.close()` ends vLLM's engine-core process, and after a `--engine vllm` pytest run no process of that
run is left. vLLM's CPU attention needs head_dim in its list, so the checkpoint is the first golden that has one
(qwen3-gqa4, head_dim 32, at the time of writing). Start-up takes 1-5 minutes on a 2-core machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (nox -s peer-vllm installs its CPU build)")
psutil = pytest.importorskip("psutil")

ROOT = Path(__file__).resolve().parents[2]
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def vllm_runnable_checkpoints() -> list[str]:
    """Golden checkpoints whose head size vLLM's CPU attention supports."""
    from golden.load import checkpoint_path, list_checkpoints

    names = []
    for name in list_checkpoints():
        cfg = json.loads((Path(checkpoint_path(name)) / "config.json").read_text())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        if head_dim in VLLM_CPU_HEAD_SIZES:
            names.append(name)
    return names


def tagged_processes(tag: str) -> list[int]:
    """Processes whose environment carries ``PEER_RUN_TAG=tag`` (children inherit it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"PEER_RUN_TAG={tag}".encode() in env.split(b"\0"):
            found.append(int(pid))
    return found


@pytest.fixture(scope="module")
def model() -> str:
    names = vllm_runnable_checkpoints()
    if not names:
        pytest.skip("no golden checkpoint has a head size vLLM's CPU build supports")
    return names[0]


def test_close_ends_the_engine_core_process(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.adapters import load_adapter

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    adapter = load_adapter("vllm", checkpoint_path(model), "float32", max_model_len=512)
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before
               and "resource_tracker" not in " ".join(p.cmdline())]  # multiprocessing's, lives with this process
    assert started, "vLLM started no engine-core process (the test would prove nothing)"
    out = adapter.generate([[1, 2, 3]], 4, 5, prompt_logprobs=False)
    assert len(out[0].token_ids) == 4
    adapter.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(alive(p) for p in started):
        time.sleep(0.5)
    left = [(p.pid, p.name()) for p in started if alive(p)]
    assert not left, f"vLLM processes left after close(): {left}"


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_no_vllm_process_is_left_after_a_pytest_run(model: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PEER_RUN_TAG": tag, "OMP_NUM_THREADS": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/test_golden.py", "-q", "-p", "no:cacheprovider", "-k", "not gpu",
         "--engine", "vllm", "--model", model, "--dtype", "float32", "--report", str(tmp_path / "r.json")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    deadline = time.monotonic() + 30  # a process that is exiting right now gets a moment
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(1)
    left = []
    for pid in tagged_processes(tag):
        try:
            proc = psutil.Process(pid)
            left.append((pid, proc.name(), " ".join(proc.cmdline())[:200]))
            proc.kill()  # do not leave it to the next test either
        except psutil.NoSuchProcess:
            pass
    assert not left, f"processes of the vLLM pytest run still alive 30 s after it ended: {left}"


def _attention_scales(model) -> list[tuple[list[float], list[float], float, float]]:
    """Per attention layer of a vLLM model: the K and V scales loaded (per head) and the ones its backend uses."""
    return [(m._k_scale.reshape(-1).tolist(), m._v_scale.reshape(-1).tolist(), m._k_scale_float, m._v_scale_float)
            for _, m in model.named_modules() if hasattr(m, "_k_scale_float")]


def fp8_kv_cache_supported() -> bool:
    """vLLM 0.32's condition for an FP8 KV cache on the CPU (cpu_attn.py ``_get_attn_isa``): AMX or AVX-512, as
    torch detects them."""
    import torch

    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_supported())


def test_vllm_loads_the_fp8_kv_tiers_per_head_scales(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fp8-kv tier's scaled checkpoint (oracle/fp8_kv.py) is one vLLM accepts with kv_cache_dtype=fp8 and reads
    the per-head scales of (without its config's kv_cache_scheme vLLM refuses it: no k_scale parameter). The CPU
    backend then applies one scale per layer, the heads' max (conformance/README.md, "FP8 KV cache")."""
    import torch

    from golden.load import checkpoint_path
    from nanovllm_ref.oracle import fp8_kv
    from nanovllm_ref.oracle.adapters import load_adapter

    configs = {m: json.loads((Path(checkpoint_path(m)) / "config.json").read_text())
               for m in vllm_runnable_checkpoints()}
    model = next((m for m, c in configs.items() if c.get("num_key_value_heads", 1) > 1), None)
    if model is None:
        pytest.skip("no golden checkpoint with several KV heads has a head size vLLM's CPU build supports")
    if not fp8_kv_cache_supported():
        pytest.skip("vLLM's CPU build refuses an FP8 KV cache without AVX-512 or AMX (v1/attention/backends/"
                    "cpu_attn.py _get_attn_isa), and this CPU has neither")
    cfg = configs[model]
    layers, heads = cfg["num_hidden_layers"], cfg["num_key_value_heads"]
    scales = {i: torch.tensor([[0.01 * (i + 1) + 0.001 * h for h in range(heads)],
                               [0.002 * (i + 1) + 0.0005 * h for h in range(heads)]]) for i in range(layers)}
    ck = fp8_kv.scaled_checkpoint(str(checkpoint_path(model)), str(tmp_path / model), scales)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's function, this test's own
    adapter = load_adapter("vllm", ck, "float32", kv_cache_dtype="fp8", enforce_eager=True, max_model_len=256)
    try:
        (got,) = adapter.llm.apply_model(_attention_scales)
    finally:
        adapter.close()
    assert len(got) == layers
    for i, (k, v, k_used, v_used) in enumerate(got):
        assert k == pytest.approx(scales[i][0].tolist(), rel=1e-6) and v == pytest.approx(scales[i][1].tolist(),
                                                                                           rel=1e-6), f"layer {i}"
        assert (k_used, v_used) == pytest.approx((max(k), max(v)), rel=1e-6), f"layer {i}: scales used"
