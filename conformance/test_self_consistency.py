"""Reference-free self-consistency: the logprob an engine reports for a token it sampled must be the logprob it
computes when the same tokens are prefilled (SGLang's KL self-consistency test).

No transformers run is needed, so the check works on real checkpoints of any size (``--model /path --reference
none``). Each prompt is sampled at temperature 1 (seeded, EOS ignored) with the sampled token's logprob
(``logprobs=0``; at temperature 1 with no other processing, raw and processed logprobs are the same); then the
prompt plus its completion is prefilled with ``prompt_logprobs=0``, which gives every completion token's logprob
at its position again. With ``r = logprob_prefill - logprob_decode`` per token, the mean approximate KL
``(e^r - 1) - r`` (Schulman's k3 estimator, >= 0, ~r^2/2) over all tokens must stay within :data:`MEAN_KL` of the
dtype, and each token's ``|r|`` within :data:`MAX_ABS_R`. A decode step that disagrees with prefill (a stale or
misplaced key in the paged cache, a decode kernel's wrong scale or mask, a position off by one in decode only,
logprobs taken from the wrong row) moves both.

The bounds sit well above what a correct engine shows and below what a decode/prefill mismatch gives. Measured
with nanovllm_ref on the twelve golden checkpoints on the CPU: float32 at rounding noise (mean k3 <= 4e-12, |r| <=
1e-5); bfloat16 mean k3 <= 4e-5, |r| <= 0.052. A decode attention scale 10% off gives mean k3 0.005-0.008 and |r|
0.32-0.42 on the same checkpoints.
"""

from __future__ import annotations

import math

import pytest

from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting, supports_requests

REFERENCE_FREE = True  # runs under --reference none
# float16 takes bfloat16's bounds (its 10-bit mantissa is the finer of the two)
MEAN_KL = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-3}  # bound on the mean k3 over all tokens
MAX_ABS_R = {"float32": 1e-3, "float16": 0.25, "bfloat16": 0.25}  # bound on each token's |r|
NUM_PROMPTS = 4
NEW_TOKENS = 24
SEED = 4242


def k3(r: float) -> float:
    return math.expm1(r) - r


def sampled_logprob(step: dict[int, float], token: int, where: str) -> float:
    if token not in step:
        raise AssertionError(f"{where}: the engine did not report the logprob of token {token} it returned")
    return step[token]


def test_decode_matches_prefill(model_spec, dtype, engines, references, record) -> None:
    if dtype not in MEAN_KL:
        pytest.skip(f"no self-consistency bound for {dtype}")
    ref = references.prompts(model_spec, dtype)
    adapter = engines.get(model_spec, dtype)
    if not supports_requests(adapter):
        pytest.skip(f"{getattr(adapter, 'name', adapter)} has no run_requests (sampling with logprobs)")
    prompts = [list(p) for p in ref.prompts[:NUM_PROMPTS]]
    specs = [RequestSpec(p, {"temperature": 1.0, "seed": SEED + i, "max_tokens": NEW_TOKENS, "ignore_eos": True,
                             "logprobs": 0}) for i, p in enumerate(prompts)]
    try:
        sampled = [c[0] for c in adapter.run_requests(specs)]
        prefill = [c[0] for c in adapter.run_requests(
            [RequestSpec(p + list(s.token_ids), {"temperature": 0.0, "max_tokens": 1, "ignore_eos": True,
                                                 "prompt_logprobs": 0}) for p, s in zip(prompts, sampled)])]
    except UnsupportedSetting as e:
        pytest.skip(str(e))
    rs, worst = [], (0.0, "")
    for pid, p, s, f in zip(ref.prompt_ids, prompts, sampled, prefill):
        assert s.logprobs is not None and len(s.logprobs) == len(s.token_ids) == NEW_TOKENS, (
            f"{pid}: {len(s.token_ids)} tokens, {0 if s.logprobs is None else len(s.logprobs)} logprob entries")
        assert f.prompt_logprobs is not None and len(f.prompt_logprobs) == len(p) + NEW_TOKENS, (
            f"{pid}: prompt logprobs for {0 if f.prompt_logprobs is None else len(f.prompt_logprobs)} of "
            f"{len(p) + NEW_TOKENS} positions")
        for j, tok in enumerate(s.token_ids):
            where = f"{pid} step {j}"
            r = (sampled_logprob(f.prompt_logprobs[len(p) + j], tok, f"{where} (prefill)")
                 - sampled_logprob(s.logprobs[j], tok, f"{where} (decode)"))
            rs.append(r)
            if abs(r) > abs(worst[0]) or math.isnan(r):
                worst = (r, f"{where}, token {tok}: decode {s.logprobs[j][tok]:.6g}, prefill "
                            f"{f.prompt_logprobs[len(p) + j][tok]:.6g}")
    mean_kl = sum(k3(r) for r in rs) / len(rs)
    summary = (f"{ref.model}/{dtype}: mean k3 {mean_kl:.3g} (bound {MEAN_KL[dtype]:g}) over {len(rs)} sampled "
               f"tokens, largest |r| {abs(worst[0]):.3g} (bound {MAX_ABS_R[dtype]:g}) at {worst[1]}")
    print(summary)
    assert not math.isnan(mean_kl) and mean_kl <= MEAN_KL[dtype], "decode and prefill logprobs disagree: " + summary
    assert abs(worst[0]) <= MAX_ABS_R[dtype], "a decode-time logprob disagrees with prefill: " + summary
