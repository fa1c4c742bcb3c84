"""The server adapters (openai, trtllm, tgi, sglang, ollama) against stand-ins that speak each server's protocol
backed by nanovllm_ref (tests/support/standin_servers.py): each route passes the qwen3-tiny float32 goldens and fails
naming the prompt and position when the stand-in corrupts one token; a server that runs another model, config
or dtype than --model / --dtype is refused with a message naming both, through the adapter and through pytest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from golden.load import checkpoint_path
from nanovllm_ref.oracle.adapters import load_adapter
from nanovllm_ref.oracle.compare import TOKENS_ONLY
from nanovllm_ref.oracle.openai_adapter import cached_tokens
from nanovllm_ref.oracle.references import golden_reference, run_check
from nanovllm_ref.oracle.served import ServerMismatch
from nanovllm_ref.oracle.tolerances import golden_tolerance

from ..support.standin_servers import Backend, Claims, serve

ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen3-tiny"
PROMPT, STEP = 3, 5  # the token the stand-in corrupts


@pytest.fixture(scope="module")
def backend() -> Backend:
    b = Backend(checkpoint_path(MODEL))
    yield b
    b.close()


@pytest.fixture(scope="module")
def ref():
    return golden_reference(MODEL, "float32")


def config() -> dict:
    return json.loads((Path(checkpoint_path(MODEL)) / "config.json").read_text())


# flavor -> (--engine prefix, what the stand-in says, --engine-arg settings the route needs)
ROUTES = {
    "vllm": ("openai", lambda: Claims(MODEL, checkpoint_path(MODEL), "torch.float32"), {}),
    "trtllm": ("trtllm", lambda: Claims(MODEL, ""), {"server_dtype": "float32"}),  # it does not say its dtype
    "tgi": ("tgi", lambda: Claims(checkpoint_path(MODEL), ""), {"server_dtype": "float32"}),
    "sglang": ("sglang", lambda: Claims(MODEL, checkpoint_path(MODEL), "float32"), {}),
    "ollama": ("ollama", lambda: Claims(MODEL, "", "F32", config()), {}),
}


class Running:
    """A stand-in and the adapter on it, for one test."""

    def __init__(self, backend: Backend, flavor: str, claims: Claims | None = None, dtype: str = "float32",
                 **engine_args) -> None:
        prefix, make_claims, args = ROUTES[flavor]
        self.server, self.url = serve(backend, flavor, claims or make_claims())
        self.spec = f"{prefix}:{self.url}"
        self.dtype, self.args = dtype, {**args, **engine_args}

    def adapter(self):
        return load_adapter(self.spec, checkpoint_path(MODEL), self.dtype, **self.args)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("flavor", list(ROUTES))
def test_route_passes_and_names_a_perturbed_token(flavor: str, backend: Backend, ref) -> None:
    with Running(backend, flavor) as run:
        adapter = run.adapter()
        report = run_check(adapter, ref, golden_tolerance("float32", checkpoint=MODEL))
        assert report.passed, report.format_failures()
        assert sum(p.status == "match" for p in report.prompts) == len(ref.prompts)  # same engine: exact
        assert report.meta["prompt_logprobs"] == (flavor not in ("trtllm", "ollama"))
        backend.perturb = {tuple(ref.prompts[PROMPT]): STEP}
        try:
            bad = run_check(adapter, ref, golden_tolerance("float32", checkpoint=MODEL))
        finally:
            backend.perturb = {}
    assert [p.prompt_id for p in bad.failures()] == [ref.prompt_ids[PROMPT]]
    assert bad.failures()[0].message.startswith(f"[{ref.prompt_ids[PROMPT]}] FAIL: gen step {STEP}: tokens differ")


def test_ollama_without_logprobs_runs_tokens_only(backend: Backend, ref) -> None:
    claims = ROUTES["ollama"][1]()
    claims.logprobs = False
    with Running(backend, "ollama", claims) as run:
        adapter = run.adapter()
        report = run_check(adapter, ref, golden_tolerance("float32", checkpoint=MODEL))
        assert report.passed and report.meta["mode"] == TOKENS_ONLY, report.format_failures()
        assert {p.mode for p in report.prompts} == {TOKENS_ONLY}
        backend.perturb = {tuple(ref.prompts[PROMPT]): STEP}
        try:
            bad = run_check(adapter, ref, golden_tolerance("float32", checkpoint=MODEL))
        finally:
            backend.perturb = {}
    message = bad.failures()[0].message
    assert len(bad.failures()) == 1 and message.startswith(f"[{ref.prompt_ids[PROMPT]}] FAIL: gen step {STEP}")
    assert "outside the reference's top-20" in message


OTHER = "qwen2-tiny"


@pytest.mark.parametrize("flavor, claims, expected", [
    ("vllm", Claims(OTHER, checkpoint_path(OTHER), "torch.float32"), [f"serves ['{OTHER}'", f"not --model '{ROOT}"]),
    ("vllm", Claims(MODEL, checkpoint_path(MODEL), "torch.bfloat16"), ["runs bfloat16, but --dtype is float32"]),
    ("vllm", Claims(MODEL, checkpoint_path(MODEL), None, dev_mode=False), ["does not say which dtype"]),
    ("vllm", Claims(MODEL, checkpoint_path(MODEL), "torch.float32", logprobs_mode="processed_logprobs"),
     ["returns processed_logprobs, not raw_logprobs"]),
    ("vllm", Claims(MODEL, checkpoint_path(MODEL), "float32", {**config(), "hidden_size": 4096}, dev_mode=False),
     ["hidden_size=4096, but --model", f"has hidden_size={config()['hidden_size']}"]),
    ("tgi", Claims(checkpoint_path(MODEL), "", "bfloat16"), ["runs bfloat16, but --dtype is float32"]),
    ("sglang", Claims(OTHER, checkpoint_path(OTHER), "float32"), [f"not --model '{ROOT}"]),
    ("ollama", Claims(MODEL, "", "BF16", config()), ["runs bfloat16, but --dtype is float32"]),
    ("ollama", Claims(MODEL, "", "F32", {**config(), "num_hidden_layers": 99}), ["num_hidden_layers=99"]),
])
def test_another_model_or_dtype_is_refused_naming_both(flavor: str, claims: Claims, expected: list[str],
                                                        backend: Backend) -> None:
    with Running(backend, flavor, claims) as run, pytest.raises(ServerMismatch) as err:
        run.adapter()
    for text in expected:
        assert text in str(err.value), str(err.value)


def test_a_declared_dtype_must_agree_with_the_server(backend: Backend) -> None:
    with Running(backend, "vllm", server_dtype="bfloat16") as run, pytest.raises(ServerMismatch, match="says bf"):
        run.adapter()
    with Running(backend, "trtllm", server_dtype="bfloat16") as run, pytest.raises(ServerMismatch, match="runs bf"):
        run.adapter()


def test_cached_tokens_come_from_usage_or_are_unknown(backend: Backend, ref) -> None:
    assert cached_tokens({"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 16}}) == 16
    assert cached_tokens({"prompt_tokens": 3}) is None and cached_tokens(None) is None
    with Running(backend, "vllm") as run:
        outs = run.adapter().generate(ref.prompts[:2], 4, 5, prompt_logprobs=False)
    assert all(isinstance(o.num_cached_tokens, int) for o in outs)


def test_tgi_refuses_a_prompt_that_does_not_survive_the_text_round_trip(backend: Backend) -> None:
    tok = backend.tok
    vocab = tok.get_vocab()
    merged = next(p for p in vocab if len(p) == 2 and p[0] in vocab and p[1] in vocab)  # "ab" is one token
    prompt = [vocab[merged[0]], vocab[merged[1]]]
    with Running(backend, "tgi") as run, pytest.raises(ValueError, match="prompt 0 .*text round trip"):
        run.adapter().generate([prompt], 2, 5, prompt_logprobs=True)


def test_pytest_run_against_a_server_of_another_dtype_is_refused(backend: Backend, tmp_path: Path) -> None:
    """The CI check that `--engine openai:URL --dtype bfloat16` against a float32 server fails the run,
    naming both dtypes, instead of reporting a passing bfloat16 row."""
    with Running(backend, "vllm") as run:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "conformance/test_golden.py", "-q", "-p", "no:cacheprovider",
             "--engine", run.spec, "--model", MODEL, "--dtype", "bfloat16", "-k", "not gpu",
             "--report", str(tmp_path / "r.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = done.stdout + done.stderr
    assert done.returncode == 1, log[-3000:]
    assert "ServerMismatch" in log and "runs float32, but --dtype is bfloat16" in log, log[-3000:]
