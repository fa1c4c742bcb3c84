"""The llama.cpp, CTranslate2 and ONNX Runtime GenAI adapters on stand-ins of their packages (tests/oracle/
standin_local_engines.py: the documented calls and shapes, backed by transformers float32), so CI checks the glue
without the engines: each passes qwen3-tiny's float32 goldens exactly, fails when the stand-in adds a constant to one
token's logits, and refuses what it cannot run with an error naming it. The real engines run in their nox sessions
(`nox -s peer-llamacpp|peer-ctranslate2|peer-ortgenai`; tests at the end of this file run there)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from golden.load import checkpoint_path
from nanovllm_ref.oracle.adapters import load_adapter
from nanovllm_ref.oracle.converted import prompt_logprob_dicts, topk_dict
from nanovllm_ref.oracle.ctranslate2_adapter import length_groups, null_unk_token, token_strings
from nanovllm_ref.oracle.llamacpp_adapter import pre_tokenizer_name
from nanovllm_ref.oracle.quant_tiers import MEASURED
from nanovllm_ref.oracle.references import golden_reference, run_check
from nanovllm_ref.oracle.tolerances import golden_tolerance, quantized_tolerance

from . import standin_local_engines as standin

ENGINES = ("llamacpp", "ctranslate2", "ortgenai")


@pytest.fixture
def standins(monkeypatch, tmp_path):
    standin.install(monkeypatch, tmp_path)
    monkeypatch.setattr(standin, "BUMP", {})
    return standin


def _check(engine: str, **kwargs):
    ref = golden_reference("qwen3-tiny", "float32").subset([0, 2, 5])  # single_a, short_2, short_8: lengths 1, 2, 8
    ref.max_tokens = 8  # the goldens' first 8 steps (the stand-ins run full forwards: keep CI short)
    for o in ref.outputs:
        o.token_ids, o.topk = o.token_ids[:8], o.topk[:8]
    adapter = load_adapter(engine, checkpoint_path("qwen3-tiny"), "float32", **kwargs)
    try:
        return run_check(adapter, ref, golden_tolerance("float32", checkpoint="qwen3-tiny"))
    finally:
        adapter.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_adapter_passes_the_goldens(standins, engine) -> None:
    report = _check(engine)
    assert report.passed, report.format_failures()
    assert all(p.status == "match" for p in report.prompts)
    assert max(p.max_abs_diff for p in report.prompts) < 1e-4


@pytest.mark.parametrize("engine", ENGINES)
def test_adapter_fails_a_shifted_logit(standins, engine, monkeypatch) -> None:
    monkeypatch.setattr(standin, "BUMP", {"token": 7, "by": 0.05})  # every position: log-probs move by ~0.05
    report = _check(engine)
    assert not report.passed
    assert any("tol" in f for p in report.prompts for f in p.failures)


@pytest.mark.parametrize("engine, quantization, tier", [("llamacpp", "q8_0", "gguf-q8_0"),
                                                        ("ctranslate2", "int8", "ct2-int8"),
                                                        ("ortgenai", "int4", "ort-int4")])
def test_quantized_adapter_names_its_tier(standins, engine, quantization, tier) -> None:
    adapter = load_adapter(engine, checkpoint_path("qwen3-tiny"), "float32", quantization=quantization)
    assert adapter.quantization == tier


def test_tiers_are_per_checkpoint() -> None:
    own = quantized_tolerance("ort-int4", "float32", "qwen2-tiny")
    worst = quantized_tolerance("ort-int4", "float32", "some-other-model")
    assert own.mean_tol == pytest.approx(2 * MEASURED["ort-int4"].checkpoints["qwen2-tiny"][2])
    assert worst.mean_tol == pytest.approx(2 * max(v[2] for v in MEASURED["ort-int4"].checkpoints.values()))
    assert own.mean_tol < worst.mean_tol and "qwen2-tiny's measured" in own.derivation


@pytest.mark.parametrize("engine", ENGINES)
def test_adapter_refusals(standins, engine) -> None:
    with pytest.raises(ValueError, match="quantization"):
        load_adapter(engine, checkpoint_path("qwen3-tiny"), "float32", quantization="int3")
    with pytest.raises(ValueError, match="dtype 'bfloat16'"):
        load_adapter(engine, checkpoint_path("qwen3-tiny"), "bfloat16")


def test_architectures_without_a_converter_are_refused(standins) -> None:
    for engine in ("ctranslate2", "ortgenai"):
        with pytest.raises(ValueError, match="Qwen3MoeForCausalLM"):
            load_adapter(engine, checkpoint_path("qwen3-moe-tiny"), "float32")


def test_tier_needs_float32_goldens() -> None:
    with pytest.raises(ValueError, match="float32"):
        quantized_tolerance("ct2-int8", "bfloat16")
    with pytest.raises(ValueError, match="no tolerance tier"):
        quantized_tolerance("gguf-q4_k")


def test_ctranslate2_groups_prompts_by_length() -> None:
    assert length_groups([[1], [2, 3], [4], [5, 6]]) == {1: [0, 2], 2: [1, 3]}


def test_ctranslate2_vocabulary_and_config_fixes(tmp_path) -> None:
    with pytest.raises(ValueError, match="repeats the token string 'a'"):
        token_strings(["a", "b", "a"])
    cfg, log = tmp_path / "config.json", tmp_path / "convert.log"
    cfg.write_text(json.dumps({"unk_token": None, "bos_token": "<s>"}))
    null_unk_token(cfg, log)
    assert json.loads(cfg.read_text()) == {"unk_token": "", "bos_token": "<s>"}
    assert "unk_token null" in log.read_text()


def test_row_helpers() -> None:
    import numpy as np

    row = np.log(np.array([0.1, 0.4, 0.4, 0.1]))
    assert list(topk_dict(row, 3)) == [1, 2, 0]  # ties by the lowest id
    rows = np.log(np.full((2, 4), 0.25))
    assert prompt_logprob_dicts(rows, [3, 1, 2], 1) == [None, {0: pytest.approx(np.log(0.25)), 1: pytest.approx(
        np.log(0.25))}, {0: pytest.approx(np.log(0.25)), 2: pytest.approx(np.log(0.25))}]


def test_llamacpp_pre_tokenizer_from_the_split_regex(tmp_path) -> None:
    assert pre_tokenizer_name(checkpoint_path("qwen3-tiny")) == "qwen2"
    (tmp_path / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": {"type": "Whitespace"}}))
    assert pre_tokenizer_name(tmp_path) == "default"


@pytest.mark.parametrize("engine, package", [("llamacpp", "llama_cpp"), ("ctranslate2", "ctranslate2"),
                                             ("ortgenai", "onnxruntime_genai")])
def test_real_engine_on_qwen3_tiny(engine, package) -> None:
    """The real engine where installed (its nox session), float32 vs the goldens: every prompt exact."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (its nox session, nox -s peer-{engine}, installs it)")
    if engine == "llamacpp" and not __import__("os").environ.get("LLAMA_CPP_DIR"):
        pytest.skip("LLAMA_CPP_DIR (llama.cpp's converter) is not set")
    report = _check(engine)
    assert report.passed, report.format_failures()
