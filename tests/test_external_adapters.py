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
