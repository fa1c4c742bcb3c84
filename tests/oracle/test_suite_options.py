"""The conformance suite's option checks at session start (nanovllm_ref/oracle/suite_options.py): each bad value is
one usage error naming the option and what it accepts, before anything is collected or built."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nanovllm_ref.oracle.suite_options import check_versions, validate_options

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {"--engine": "nanovllm_ref", "--engine-arg": [], "--model": [], "--dtype": "float32,bfloat16",
            "--reference": "golden", "--tp": 1, "--kernels": None, "--invariance-trials": 3,
            "--speculative-config": None}


class FakeConfig:
    def __init__(self, **options: object) -> None:
        self.options = {**DEFAULTS, **{f"--{k.replace('_', '-')}": v for k, v in options.items()}}

    def getoption(self, name: str) -> object:
        return self.options[name]


def usage_error(**options: object) -> str:
    with pytest.raises(pytest.UsageError) as e:
        validate_options(FakeConfig(**options))
    return str(e.value)


def test_defaults_and_good_values_pass() -> None:
    validate_options(FakeConfig())
    validate_options(FakeConfig(engine="openai:http://127.0.0.1:8000/v1", engine_arg=["max_n_per_request=8"],
                                model=["qwen3-tiny,qwen2-tiny@rope_scaling"], dtype="float32", tp=2))
    validate_options(FakeConfig(engine="hf", engine_arg=["attn_implementation=sdpa"], reference="live",
                                dtype="float16", kernels="nanovllm_ref.testing.kernels:nanovllm_ref_candidates"))
    validate_options(FakeConfig(engine="tests.support.perturbing_adapter:token_factory"))  # a pkg.module:factory
    validate_options(FakeConfig(speculative_config='{"method": "ngram", "num_speculative_tokens": 2}'))


@pytest.mark.parametrize("options, expected", [
    (dict(dtype="fp32"), "--dtype 'fp32': valid dtypes are float32, bfloat16"),
    (dict(dtype="float32,float16"), "float16 needs --reference live"),
    (dict(engine="hff"),
     "--engine 'hff': unknown engine; expected one of ['ctranslate2', 'hf', 'llamacpp', 'nanovllm_ref', 'ortgenai'"),
    (dict(engine="openai:127.0.0.1:8000/v1"), "openai: takes a server URL starting with http://"),
    (dict(engine="nosuchpkg.mod:make"), "cannot import 'nosuchpkg.mod'"),
    (dict(engine="tests.support.perturbing_adapter:no_such_factory"), "has no 'no_such_factory'"),
    (dict(model=["qwen3-tiny,qwen3-tinny"]), "--model 'qwen3-tinny': neither a golden checkpoint (llama3-bias-hd32"),
    (dict(tp=0), "--tp 0: must be an integer >= 1"),
    (dict(model=["qwen3-tiny@rope_theta"]), "unknown config dialect 'rope_theta'"),
    (dict(invariance_trials=0), "--invariance-trials 0: must be an integer >= 1"),
    (dict(engine="sglang"), "--engine sglang: the sglang package is not installed here (pip install sglang)"),
    (dict(engine="llamacpp"),
     "--engine llamacpp: the llama_cpp package is not installed here (pip install llama-cpp-python)"),
    (dict(kernels="mykernels"), "--kernels 'mykernels': expected pkg.module:function"),
    (dict(engine_arg=["max_model_len"]), "--engine-arg 'max_model_len': expected KEY=VALUE"),
    (dict(engine_arg=["max_modle_len=512"]), "engine 'nanovllm_ref' takes no setting 'max_modle_len'; valid keys:"),
    (dict(engine="hf", engine_arg=["enforce_eager=true"]), "valid keys: attn_implementation, device"),
    (dict(engine="openai:http://h/v1", engine_arg=["n_cap=4"]), "max_n_per_request"),
    (dict(speculative_config="{method: ngram}"), "--speculative-config '{method: ngram}': Expecting property name"),
    (dict(speculative_config="[3]"), "expected a JSON object of the engine's speculative_config fields"),
    (dict(engine="hf", speculative_config='{"method": "ngram"}'), "engine 'hf' takes no speculative_config"),
])
def test_bad_values_are_one_usage_error_naming_the_option(options: dict, expected: str) -> None:
    assert expected in usage_error(**options)


def test_versions_outside_the_declared_range_are_refused() -> None:
    check_versions(["torch>=2.0", "numpy"])
    with pytest.raises(pytest.UsageError, match=r"torch .* is outside the range nanovllm_ref supports \(torch>=99"):
        check_versions(["torch>=99.0"])
    check_versions(["triton>=99; extra == 'gpu'"] if "triton" not in sys.modules else ["triton>=0.1"])


def test_a_bad_dtype_stops_pytest_within_seconds_before_collecting() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "conformance", "--dtype", "fp32", "-q", "-p",
                           "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "--dtype 'fp32': valid dtypes are float32, bfloat16" in proc.stderr
    assert "collected" not in proc.stdout and elapsed < 30, (elapsed, proc.stdout)
