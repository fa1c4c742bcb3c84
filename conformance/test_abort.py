"""Aborting requests mid-generation (any engine whose adapter has ``abort_requests``, oracle/requests.py).

A seeded request with n = N samples and a short greedy request are added together; after STEPS engine steps the
unfinished one is aborted. The abort must return the request's output with all N samples, each with
finish_reason "abort" (vLLM's) and the tokens it had drawn: a prefix of what the same seeded sample draws when it
runs to the end (sample i of a request seeded s is the request seeded s + i, vLLM's convention). The short request
finished on its own before the abort. The engine then serves a new request as before (nothing left running).
"""

from __future__ import annotations

import pytest

from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting, supports_abort, supports_requests

from .harness import selected_models

DTYPE = "float32"
N, STEPS, MAX_TOKENS, SEED = 4, 4, 16, 2024
PROMPT, SHORT = [9, 10, 11, 12, 13, 14, 15], [20, 21, 22, 23]  # token ids inside every golden vocabulary


def _sampled(seed: int, n: int = 1) -> RequestSpec:
    return RequestSpec(PROMPT, {"temperature": 1.0, "max_tokens": MAX_TOKENS, "ignore_eos": True, "seed": seed,
                                **({"n": n} if n > 1 else {})})


GREEDY = RequestSpec(SHORT, {"temperature": 0.0, "max_tokens": 2, "ignore_eos": True})


@pytest.fixture(scope="module")
def abort_engine(pytestconfig, engines):
    models = selected_models(pytestconfig)
    adapter = engines.get(next((m for m in models if m.name == "qwen3-tiny"), models[0]), DTYPE)
    if not supports_requests(adapter) or not supports_abort(adapter):
        pytest.skip(f"engine {adapter.name}: the abort case needs abort_requests (oracle/requests.py)")
    return adapter


def test_abort_returns_every_sample(abort_engine) -> None:
    try:
        full = [out[0] for out in abort_engine.run_requests([_sampled(SEED + i) for i in range(N)] + [GREEDY])]
        outs = abort_engine.abort_requests([_sampled(SEED, N), GREEDY], STEPS)
    except UnsupportedSetting as e:
        pytest.skip(f"engine lacks a setting: {e}")
    assert outs[0] is not None, f"aborting a request with n={N} returned no output"
    assert len(outs[0]) == N, f"the aborted request with n={N} returned {len(outs[0])} samples"
    bad = [f"  sample {i}: finish_reason {c.finish_reason!r}, tokens {list(c.token_ids)} (run to the end: "
           f"{list(full[i].token_ids)})" for i, c in enumerate(outs[0])
           if c.finish_reason != "abort" or not 0 < len(c.token_ids) < MAX_TOKENS
           or list(c.token_ids) != list(full[i].token_ids)[:len(c.token_ids)]]
    assert not bad, f"the samples of a request aborted after {STEPS} steps:\n" + "\n".join(bad)
    short = outs[1]
    assert short is not None and [(c.finish_reason, list(c.token_ids)) for c in short] == [
        ("length", list(full[N].token_ids))], f"the short request beside the aborted one: {short}"
    after = abort_engine.run_requests([GREEDY])[0][0]
    assert list(after.token_ids) == list(full[N].token_ids), "the engine serves differently after the abort"
