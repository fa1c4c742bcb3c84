"""The comparison policy itself, on hand-made outputs (no engine): what passes, what diverges, what fails."""

from __future__ import annotations

import json

from nanovllm_ref.oracle.compare import DIVERGED_OK, FAIL, MATCH, EngineOutput, compare_all, compare_outputs
from nanovllm_ref.oracle.tolerances import FLOOR, NOISE_FACTOR, golden_tolerance, measured_noise


def out(tokens, dicts, prompt=None) -> EngineOutput:
    return EngineOutput(list(tokens), [dict(d) for d in dicts], prompt)


STEP = {1: -0.5, 2: -0.6, 3: -3.0}


def test_match_and_max_diff() -> None:
    ref = out([1, 1], [STEP, STEP])
    cand = out([1, 1], [STEP, {1: -0.5, 2: -0.6005, 3: -3.0}])
    r = compare_outputs(ref, cand, top_k=3, tol=1e-3, prompt_tol=None, prompt_id="p")
    assert r.status == MATCH and r.matched_tokens == 2
    assert abs(r.max_abs_diff - 5e-4) < 1e-9 and r.where.startswith("gen step 1, token 2")


def test_divergence_within_top_k_passes_and_stops() -> None:
    ref = out([1, 1, 1], [STEP, STEP, STEP])
    cand = out([1, 2, 7], [STEP, {2: -0.5001, 1: -0.5002, 3: -3.0}, {7: 0.0}])  # step 2 is never compared
    r = compare_outputs(ref, cand, top_k=3, tol=0.2, prompt_tol=None)
    assert r.status == DIVERGED_OK and r.first_divergence == 1 and r.matched_tokens == 1
    strict = compare_outputs(ref, cand, top_k=3, tol=0.2, prompt_tol=None, allow_divergence=False)
    assert strict.status == FAIL


def test_divergence_outside_top_k_fails_with_tokens_and_ranks() -> None:
    ref = out([1], [STEP])
    cand = out([9], [{9: -0.1, 1: -0.5, 2: -0.6}])
    r = compare_outputs(ref, cand, top_k=3, tol=10.0, prompt_tol=None, prompt_id="p7")
    assert r.status == FAIL
    assert "p7" in r.message and "token 9" in r.message and "absent from top-k" in r.message
    assert "rank 1" in r.message and "gen step 0" in r.message


def test_value_and_bound_violations() -> None:
    ref = out([1], [STEP])
    assert compare_outputs(ref, out([1], [{1: -0.5, 2: -0.7, 3: -3.0}]), top_k=3, tol=0.05,
                           prompt_tol=None).status == FAIL
    # token 2 (ref -0.6) is missing from the candidate's full top-3 whose 3rd value is -2.0: off by >= 1.4
    r = compare_outputs(ref, out([1], [{1: -0.5, 4: -1.0, 5: -2.0}]), top_k=3, tol=0.5, prompt_tol=None)
    assert r.status == FAIL and "missing from the candidate top-3" in r.failures[0]


def test_length_and_prompt_logprobs() -> None:
    ref = out([1, 1], [STEP, STEP], [None, {5: -1.0, 6: -2.0}])
    assert compare_outputs(ref, out([1], [STEP], ref.prompt_logprobs), top_k=3, tol=1e-3,
                           prompt_tol=1e-3).status == FAIL
    assert compare_outputs(ref, out([1, 1], [STEP, STEP]), top_k=3, tol=1e-3, prompt_tol=1e-3).status == FAIL
    ok = out([1, 1], [STEP, STEP], [None, {5: -1.0002, 6: -2.0}])
    assert compare_outputs(ref, ok, top_k=3, tol=1e-3, prompt_tol=1e-3, prompt=[4, 6]).status == MATCH
    assert compare_outputs(ref, ok, top_k=3, tol=1e-3, prompt_tol=1e-4).status == FAIL
    wrong_token = out([1, 1], [STEP, STEP], [None, {5: -1.0, 7: -2.5}])
    assert compare_outputs(ref, wrong_token, top_k=3, tol=1e-3, prompt_tol=1e-3, prompt=[4, 6]).status == FAIL


def test_report_table_and_json() -> None:
    ref = [out([1], [STEP]), out([1], [STEP])]
    cand = [out([1], [STEP]), out([9], [{9: 0.0}])]
    rep = compare_all(ref, cand, top_k=3, tol=1e-3, prompt_tol=None, prompt_ids=["a", "b"], model="m",
                      dtype="float32", engine="e", case="c")
    assert not rep.passed and [p.prompt_id for p in rep.failures()] == ["b"]
    table = rep.summary_table()
    assert list(table["status"]) == [MATCH, FAIL] and list(table["prompt"]) == ["a", "b"]
    per_model = rep.summary_table("model")
    assert per_model.loc[0, "fail"] == 1 and per_model.loc[0, "match"] == 1
    assert json.loads(rep.to_json())["passed"] is False
    assert "m/float32/c: [b] FAIL" in rep.format_failures()


def test_tolerance_derivation() -> None:
    manifest = {"checkpoints": {"x": {"noise": {"float32": {
        "a": {"generated": {"max": 1e-5}, "prompt": {"max": 2e-6}},
        "b": {"generated": {"max": 4e-5}, "prompt": {"max": 1e-6}}}}}}}
    assert measured_noise(manifest, "float32") == (4e-5, 2e-6)
    t = golden_tolerance("float32", manifest)
    assert t.tol == max(NOISE_FACTOR * 4e-5, FLOOR["float32"])
    assert t.prompt_tol == max(NOISE_FACTOR * 2e-6, FLOOR["float32"])
    assert golden_tolerance("float32", {}).tol == FLOOR["float32"]


def test_moe_noise_is_pooled_apart() -> None:
    def entry(noise: float, **config) -> dict:
        return {"config": config, "noise": {"bfloat16": {"a": {"generated": {"max": noise}, "prompt": {"max": noise}}}}}

    manifest = {"checkpoints": {"dense": entry(0.3), "moe": entry(2.0, num_experts_per_tok=2)}}
    assert measured_noise(manifest, "bfloat16") == (0.3, 0.3)
    assert measured_noise(manifest, "bfloat16", "dense") == (0.3, 0.3)
    assert measured_noise(manifest, "bfloat16", "moe") == (2.0, 2.0)
    assert golden_tolerance("bfloat16", manifest, "moe").tol == NOISE_FACTOR * 2.0


def test_rescaled_checkpoints_are_bounded_by_their_own_noise_only() -> None:
    def entry(noise: float, post: dict | None = None) -> dict:
        return {"config": {}, "train": {"post_training": post} if post else {},
                "noise": {"bfloat16": {"a": {"generated": {"max": noise}, "prompt": {"max": noise}}}}}

    manifest = {"checkpoints": {"dense": entry(0.3), "sharp": entry(0.8, {"score_scale": 3.0}),
                                "tiny": entry(0.1, {"residual_scale": 0.05})}}
    assert measured_noise(manifest, "bfloat16") == (0.3, 0.3)
    assert measured_noise(manifest, "bfloat16", "sharp") == (0.8, 0.8)
    assert measured_noise(manifest, "bfloat16", "tiny") == (0.1, 0.1)
