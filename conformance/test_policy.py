"""The comparison policy itself, on hand-made outputs (no engine): what passes, what diverges, what fails."""

from __future__ import annotations

import json

from nanovllm_ref.oracle.compare import DIVERGED_OK, FAIL, MATCH, EngineOutput, compare_all, compare_outputs
from nanovllm_ref.oracle.tolerances import FLOOR, NOISE_FACTOR, golden_tolerance, measured_noise

REFERENCE_FREE = True  # runs under --reference none


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
    assert [r["status"] for r in table] == [MATCH, FAIL] and [r["prompt"] for r in table] == ["a", "b"]
    per_model = rep.summary_table("model")
    assert per_model[0]["fail"] == 1 and per_model[0]["match"] == 1
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


def test_wide_head_noise_is_pooled_apart() -> None:
    """A head_dim-128 checkpoint's larger bf16 noise bounds itself, not the narrower dense checkpoints."""
    def entry(noise: float, **config) -> dict:
        return {"config": config, "noise": {"bfloat16": {"a": {"generated": {"max": noise}, "prompt": {"max": noise}}}}}

    manifest = {"checkpoints": {"hd32": entry(0.3, head_dim=32), "hd128": entry(0.37, head_dim=128),
                                "implied128": entry(0.36, hidden_size=512, num_attention_heads=4)}}
    assert measured_noise(manifest, "bfloat16") == (0.3, 0.3)
    assert measured_noise(manifest, "bfloat16", "hd32") == (0.3, 0.3)
    assert measured_noise(manifest, "bfloat16", "hd128") == (0.37, 0.37)
    assert measured_noise(manifest, "bfloat16", "implied128") == (0.37, 0.37)


def test_tokens_only_mode_compares_tokens_and_the_divergence_against_the_reference_top_k() -> None:
    """For engines without logprobs: equal tokens match; a first differing token inside the reference's top-k
    passes as a divergence; one outside it, or a short output, fails naming prompt and step; no values."""
    from nanovllm_ref.oracle.compare import TOKENS_ONLY

    ref = out([1, 1, 1], [STEP, STEP, STEP], prompt=[None, {1: -0.1}])
    same = EngineOutput([1, 1, 1], [], None)
    r = compare_outputs(ref, same, top_k=3, tol=1e-6, prompt_tol=1e-6, prompt_id="p", tokens_only=True)
    assert r.status == MATCH and r.mode == TOKENS_ONLY and "tokens-only" in r.message
    near = EngineOutput([1, 2, 5], [], None)  # token 2 is rank 2 of the reference: a near tie
    r = compare_outputs(ref, near, top_k=3, tol=1e-6, prompt_tol=None, tokens_only=True)
    assert r.status == DIVERGED_OK and r.first_divergence == 1
    far = EngineOutput([1, 9, 9], [], None)
    r = compare_outputs(ref, far, top_k=3, tol=1e-6, prompt_tol=None, prompt_id="p4", tokens_only=True)
    assert r.status == FAIL and r.message.startswith("[p4] FAIL: gen step 1: tokens differ")
    assert "outside the reference's top-3" in r.message and "candidate: no logprobs" in r.message
    assert compare_outputs(ref, near, top_k=1, tol=1e-6, prompt_tol=None, tokens_only=True).status == FAIL
    short = EngineOutput([1, 1], [], None)
    assert compare_outputs(ref, short, top_k=3, tol=1e-6, prompt_tol=None, tokens_only=True).status == FAIL
    strict = compare_outputs(ref, near, top_k=3, tol=1e-6, prompt_tol=None, allow_divergence=False, tokens_only=True)
    assert strict.status == FAIL
    # the same candidate without tokens-only fails for its missing logprobs: the mode must be chosen
    assert compare_outputs(ref, same, top_k=3, tol=1e-6, prompt_tol=None).status == FAIL


def test_run_check_selects_tokens_only_for_an_adapter_without_logprobs() -> None:
    from nanovllm_ref.oracle.compare import TOKENS_ONLY
    from nanovllm_ref.oracle.references import Reference, run_check
    from nanovllm_ref.oracle.tolerances import golden_tolerance

    ref = Reference("m", "", "float32", [[5, 6]], ["p0"], [out([1, 1], [STEP, STEP], prompt=[None, {6: -1.0}])])

    class NoLogprobs:
        name, returns_logprobs = "tokens", False

        def generate(self, prompts, max_tokens, top_k, prompt_logprobs):
            return [EngineOutput([1, 2], [], None)]

        def close(self) -> None:
            pass

    report = run_check(NoLogprobs(), ref, golden_tolerance("float32"))
    assert report.passed and report.meta["mode"] == TOKENS_ONLY
    table = report.summary_table("model")
    assert [r["mode"] for r in table] == [TOKENS_ONLY] and table[0]["diverged_ok"] == 1


def test_ids_from_text_follows_the_reference_not_a_re_tokenization() -> None:
    """A text-only answer: "ab" re-tokenizes to the merged token 3, but the engine generated 1, 2."""
    from nanovllm_ref.oracle.compare import ids_from_text

    pieces = {1: "a", 2: "b", 3: "ab", 4: "c", 5: "d", 6: "e"}
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    ref = out([1, 2, 4], [{1: -0.1, 3: -2.0}, {2: -0.1}, {4: -0.1, 5: -0.2, 6: -9.0}])
    assert ids_from_text("abc", ref, decode, top_k=2) == [1, 2, 4]
    assert ids_from_text("abd", ref, decode, top_k=2) == [1, 2, 5]  # diverged to the rank-2 token
    assert ids_from_text("abe", ref, decode, top_k=2) == [1, 2, -1]  # "e" is rank 3: outside the top-2
    assert ids_from_text("ab", ref, decode, top_k=2) == [1, 2]  # stopped early: a length mismatch follows
    r = compare_outputs(ref, EngineOutput([1, 2, -1], [], None), top_k=2, tol=1e-6, prompt_tol=None,
                        prompt_id="p", tokens_only=True)
    assert r.status == FAIL and "gen step 2" in r.message


def test_rescaled_checkpoints_are_bounded_by_their_own_noise_only() -> None:
    def entry(noise: float, post: dict | None = None) -> dict:
        return {"config": {}, "train": {"post_training": post} if post else {},
                "noise": {"bfloat16": {"a": {"generated": {"max": noise}, "prompt": {"max": noise}}}}}

    manifest = {"checkpoints": {"dense": entry(0.3), "sharp": entry(0.8, {"score_scale": 3.0}),
                                "tiny": entry(0.1, {"residual_scale": 0.05})}}
    assert measured_noise(manifest, "bfloat16") == (0.3, 0.3)
    assert measured_noise(manifest, "bfloat16", "sharp") == (0.8, 0.8)
    assert measured_noise(manifest, "bfloat16", "tiny") == (0.1, 0.1)


def test_a_systematic_shift_within_the_per_position_bound_fails_the_set_mean() -> None:
    """What let vLLM's dropped Qwen3-MoE o_proj bias pass in bf16: every position within the wide MoE bound (kept
    for rare routing near-ties), but the whole set shifted. The mean bound fails the set, naming it; the same set
    with one large difference (a near-tie) and exact elsewhere passes."""
    ref = [out([1] * 4, [STEP] * 4) for _ in range(5)]
    shifted = {1: -0.5 + 0.4, 2: -0.6 - 0.4, 3: -3.0 + 0.4}
    cand = [out([1] * 4, [shifted] * 4) for _ in range(5)]
    rep = compare_all(ref, cand, top_k=3, tol=6.0, prompt_tol=None, model="m", dtype="bfloat16", engine="e",
                      mean_tol=0.15)
    assert all(p.status == MATCH for p in rep.prompts) and not rep.passed
    assert len(rep.set_failures) == 1 and "mean |dlogprob| over the 60 shared top-3" in rep.set_failures[0]["message"]
    assert "0.4 > mean_tol 0.15" in rep.format_failures() and rep.set_failures[0]["model"] == "m"
    assert abs(rep.set_failures[0]["mean"] - 0.4) < 1e-9 and rep.set_failures[0]["mean_tol"] == 0.15
    assert json.loads(rep.to_json())["set_failures"] == rep.set_failures
    assert abs(rep.summary_table("model")[0]["mean_dlogprob"] - 0.4) < 1e-9
    near_tie = [out([1] * 4, [STEP] * 3 + [shifted | {2: -0.6 - 5.0}]) for _ in range(1)] + ref[1:]
    ok = compare_all(ref, near_tie, top_k=3, tol=6.0, prompt_tol=None, mean_tol=0.15)
    assert ok.passed and ok.prompts[0].max_abs_diff == 5.0
    assert compare_all(ref, cand, top_k=3, tol=6.0, prompt_tol=None).passed  # no mean_tol: not checked
    merged = compare_all(ref, ref, top_k=3, tol=6.0, prompt_tol=None, mean_tol=0.15).extend(rep)
    assert not merged.passed and merged.set_failures == rep.set_failures


def test_mean_tolerance_derivation() -> None:
    def entry(mx: float, mean: float, **config) -> dict:
        return {"config": config, "noise": {"bfloat16": {
            "a": {"generated": {"max": mx, "mean": mean}, "prompt": {"max": mx}},
            "b": {"generated": {"max": mx / 2, "mean": mean / 4}, "prompt": {"max": mx}}}}}

    manifest = {"checkpoints": {"dense": entry(0.3, 0.03), "moe": entry(2.1, 0.049, num_experts_per_tok=3)}}
    moe = golden_tolerance("bfloat16", manifest, "moe")
    assert moe.tol == NOISE_FACTOR * 2.1 and moe.mean_tol == NOISE_FACTOR * 0.049
    assert golden_tolerance("bfloat16", manifest, "dense").mean_tol == NOISE_FACTOR * 0.03
    assert moe.override(tol=9.0).mean_tol == moe.mean_tol
    assert golden_tolerance("float32", manifest).mean_tol is None  # no means recorded for float32 here
    real = golden_tolerance("bfloat16", checkpoint="qwen3-moe-unnorm-hd32")  # the shipped manifest records means
    assert real.mean_tol is not None and real.mean_tol < real.tol / 10


def test_divergence_by_value_admits_a_token_just_outside_the_top_k_within_the_bound() -> None:
    """Quantization tiers (divergence_by_value): the reference's token 1 (lp -0.5) is absent from the candidate's
    top-3, whose 3rd value is -1.2 (and the candidate's token 9, lp -1.0, from the reference's, 3rd value -3.0);
    within a bound of 2 both are admitted, within 0.3 not, and without the setting the top-k rule fails it whatever
    the bound."""
    ref = out([1], [STEP])
    cand = out([9], [{9: -1.0, 2: -1.1, 3: -1.2}])
    assert compare_outputs(ref, cand, top_k=3, tol=2.0, prompt_tol=None, divergence_by_value=True).status == DIVERGED_OK
    assert compare_outputs(ref, cand, top_k=3, tol=0.3, prompt_tol=None, divergence_by_value=True).status == FAIL
    assert compare_outputs(ref, cand, top_k=3, tol=2.0, prompt_tol=None).status == FAIL
