"""The vLLM and SGLang adapters: output conversion on stand-in objects of the engines' shapes (no packages
needed), clear errors, and (only where vllm / sglang and a GPU are installed) the real engines vs the goldens."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from nanovllm_ref.oracle.adapters import ADAPTERS, load_adapter, resolve_factory
from nanovllm_ref.oracle.external_adapters import (
    SGLangAdapter,
    VLLMAdapter,
    sglang_output_to_engine_output,
    vllm_output_to_engine_output,
)


def lp(x: float) -> SimpleNamespace:
    """vLLM's Logprob: logprob, rank, decoded_token."""
    return SimpleNamespace(logprob=x, rank=1, decoded_token="?")


def fake_vllm_output() -> SimpleNamespace:
    completion = SimpleNamespace(token_ids=[7, 3], logprobs=[{7: lp(-0.1), 2: lp(-2.5)}, {5: lp(-0.2), 3: lp(-4.0)}])
    prompt = [None, {4: lp(-1.0), 9: lp(-3.0)}, {4: lp(-0.5)}]
    return SimpleNamespace(request_id="0", outputs=[completion], prompt_logprobs=prompt, num_cached_tokens=16)


def test_vllm_output_conversion() -> None:
    out = vllm_output_to_engine_output(fake_vllm_output())
    assert out.token_ids == [7, 3]
    assert out.topk == [{7: -0.1, 2: -2.5}, {5: -0.2, 3: -4.0}]
    assert out.prompt_logprobs == [None, {4: -1.0, 9: -3.0}, {4: -0.5}]
    assert out.num_cached_tokens == 16
    assert all(isinstance(v, float) for d in out.topk for v in d.values())


def test_vllm_output_without_logprobs_is_a_clear_error() -> None:
    ro = fake_vllm_output()
    ro.outputs[0].logprobs = None
    with pytest.raises(ValueError, match="logprobs=N"):
        vllm_output_to_engine_output(ro)
    ro = fake_vllm_output()
    ro.prompt_logprobs = None  # not asked for: allowed, and reported as absent
    assert vllm_output_to_engine_output(ro).prompt_logprobs is None


def fake_sglang_result() -> dict:
    """Engine.generate's dict: (logprob, token_id, text) triples; prompt position 0 has no logprob."""
    meta = {
        "output_token_logprobs": [(-0.1, 7, None), (-4.0, 3, None)],
        "output_top_logprobs": [[(-0.1, 7, None), (-2.5, 2, None)], [(-0.2, 5, None), (-0.9, 6, None)]],
        "input_token_logprobs": [(None, 1, None), (-3.0, 9, None), (-0.5, 4, None)],
        "input_top_logprobs": [None, [(-1.0, 4, None), (-2.0, 8, None)], [(-0.5, 4, None)]],
        "cached_tokens": 0,
    }
    return {"text": "", "output_ids": [7, 3], "meta_info": meta}


def test_sglang_output_conversion_adds_the_actual_tokens() -> None:
    out = sglang_output_to_engine_output(fake_sglang_result())
    assert out.token_ids == [7, 3]
    assert out.topk == [{7: -0.1, 2: -2.5}, {5: -0.2, 6: -0.9, 3: -4.0}]  # the chosen token 3 added
    assert out.prompt_logprobs == [None, {4: -1.0, 8: -2.0, 9: -3.0}, {4: -0.5}]
    assert out.num_cached_tokens == 0
    assert sglang_output_to_engine_output(fake_sglang_result(), prompt_logprobs=False).prompt_logprobs is None


def test_sglang_output_errors_name_the_missing_setting() -> None:
    r = fake_sglang_result()
    del r["meta_info"]["output_top_logprobs"]
    with pytest.raises(ValueError, match="top_logprobs_num"):
        sglang_output_to_engine_output(r)
    r = fake_sglang_result()
    del r["meta_info"]["input_top_logprobs"]
    with pytest.raises(ValueError, match="logprob_start_len=0"):
        sglang_output_to_engine_output(r)
    r = fake_sglang_result()
    r["meta_info"]["input_top_logprobs"].pop()
    with pytest.raises(ValueError, match="3 prompt token logprobs but 2"):
        sglang_output_to_engine_output(r)


@pytest.mark.parametrize("name, cls", [("vllm", VLLMAdapter), ("sglang", SGLangAdapter)])
def test_registered_by_name(name: str, cls: type) -> None:
    assert name in ADAPTERS and resolve_factory(name) is cls


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_missing_package_says_what_to_install(name: str, qwen3_path: str) -> None:
    if importlib.util.find_spec(name) is not None:
        pytest.skip(f"{name} is installed")
    with pytest.raises(ImportError, match=f"pip install {name}"):
        load_adapter(name, qwen3_path, "float32")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_real_engine_matches_the_bf16_goldens(name: str, qwen3_path: str) -> None:
    pytest.importorskip(name, reason=f"{name} is not installed")
    if not torch.cuda.is_available():
        pytest.skip(f"{name} needs a CUDA GPU")
    from nanovllm_ref.oracle.references import golden_reference, run_check
    from nanovllm_ref.oracle.tolerances import golden_tolerance

    adapter = load_adapter(name, qwen3_path, "bfloat16")
    try:
        report = run_check(adapter, golden_reference("qwen3-tiny", "bfloat16"), golden_tolerance("bfloat16"))
    finally:
        adapter.close()
    assert report.passed, report.format_failures()


LIVE: list[str] = []  # adapters of the pool test that are open


class Counted:
    """A fake engine that records whether it is open, for the pool test."""

    name = "counted"

    def __init__(self, model_path: str, dtype: str, **kwargs) -> None:
        self.key, self.kwargs = f"{model_path}/{dtype}", kwargs
        LIVE.append(self.key)

    def generate(self, prompts, max_tokens, top_k, prompt_logprobs):
        from nanovllm_ref.oracle.compare import EngineOutput

        return [EngineOutput([0] * max_tokens, [{0: 0.0}] * max_tokens) for _ in prompts]

    def close(self) -> None:
        LIVE.remove(self.key)


def test_pool_keeps_one_engine_alive_and_passes_engine_args() -> None:
    from conformance.harness import EnginePool, ModelSpec, Options

    opts = Options(f"{__name__}:Counted", "golden", 1, None, None, (("max_model_len", 512), ("enforce_eager", True)))
    pool = EnginePool(opts)
    a, b = ModelSpec("a", "/a", True), ModelSpec("b", "/b", True)
    first = pool.get(a, "float32")
    assert first.kwargs == {"max_model_len": 512, "enforce_eager": True} and LIVE == ["/a/float32"]
    assert pool.get(a, "float32") is first  # reused
    pool.get(b, "float32")
    assert LIVE == ["/b/float32"]  # the first engine was closed before the second was built
    pool.get(b, "bfloat16", max_model_len=64)
    assert LIVE == ["/b/bfloat16"]
    pool.close()
    assert LIVE == []


def test_engine_arg_parsing() -> None:
    from nanovllm_ref.oracle.pytest_plugin import parse_engine_args

    assert parse_engine_args(["max_model_len=512", "enforce_eager=true", "kv_cache_dtype=auto", "x=[1, 2]",
                              "served_model=a=b"]) == (("max_model_len", 512), ("enforce_eager", True),
                                                       ("kv_cache_dtype", "auto"), ("x", [1, 2]),
                                                       ("served_model", "a=b"))
    for bad in ["novalue", "=3", "not-an-identifier=1"]:
        with pytest.raises(pytest.UsageError, match="KEY=VALUE"):
            parse_engine_args([bad])


def test_engine_arg_reaches_the_factory_through_pytest(tmp_path) -> None:
    """`--engine-arg` on the command line arrives in the engine factory's kwargs (a nanovllm_ref setting that
    changes nothing in the results: the block size)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "pytest", "conformance/test_golden.py", "-q", "-p", "no:cacheprovider", "-k",
            "not gpu", "--model", "qwen3-tiny", "--dtype", "float32", "--report", str(tmp_path / "r.json")]
    done = subprocess.run(args + ["--engine-arg", "kvcache_block_size=32"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    done = subprocess.run(args + ["--engine-arg", "no_such_setting=1"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    # an unknown setting is refused when pytest starts (suite_options.py), naming it and the valid keys
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "takes no setting 'no_such_setting'; valid keys:" in done.stderr
