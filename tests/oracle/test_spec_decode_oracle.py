"""The speculative-decoding side of the oracle (nanovllm_ref/oracle/spec_decode.py, conformance/speculation.py): which
configs a checkpoint gets, the counts and their summary, and the checks that speculation happened and that a greedy
run with it equals one without."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from conformance.speculation import first_difference, speculation_problems
from golden.load import checkpoint_path
from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.external_adapters import VLLMAdapter
from nanovllm_ref.oracle.requests import Completion
from nanovllm_ref.oracle.spec_decode import SpecConfig, SpecCounts, configs_for, option_config, summary_lines


@dataclass(frozen=True)
class Model:
    name: str
    path: str
    golden: bool = True


TINY, GQA4 = Model("qwen3-tiny", checkpoint_path("qwen3-tiny")), Model("qwen3-gqa4", checkpoint_path("qwen3-gqa4"))
WORDS = Model("qwen3-words-hd32", checkpoint_path("qwen3-words-hd32"))


def test_configs_per_checkpoint() -> None:
    tiny = configs_for(NanovllmRefAdapter, TINY, None)
    assert [c.name for c in tiny] == ["ngram-k1", "ngram-k3", "ngram-k5", "draft-self-k3", "draft-layers-k1",
                                      "draft-layers-k5"]
    layers = tiny[-1].speculative["model"]  # the target's first half of layers, a draft that is not the target
    with open(os.path.join(layers, "config.json")) as f, open(os.path.join(TINY.path, "config.json")) as g:
        assert 2 * json.load(f)["num_hidden_layers"] == json.load(g)["num_hidden_layers"]
    assert not tiny[-1].draft_is_target and tiny[-1].k == 5
    gqa4 = {c.name: c for c in configs_for(NanovllmRefAdapter, GQA4, None)}
    assert gqa4["draft-qwen3-tiny-k3"].speculative["model"] == TINY.path  # the same tokenizer as qwen3-tiny
    assert "draft-qwen3-tiny-k3" not in {c.name for c in configs_for(NanovllmRefAdapter, WORDS, None)}
    assert gqa4["draft-self-k3"].draft_is_target and not gqa4["draft-qwen3-tiny-k3"].draft_is_target
    vllm = configs_for(VLLMAdapter, GQA4, '{"method": "ngram", "num_speculative_tokens": 4}')
    assert [(c.name, c.k) for c in vllm] == [("ngram-k1", 1), ("ngram-k3", 3), ("option-ngram-k4", 4)]
    assert vllm[0].settings["disable_log_stats"] is False  # vLLM's get_metrics needs stat logging
    (none,) = configs_for(lambda path, dtype: None, TINY, None)  # a factory that advertises nothing
    assert none.name is None and none.id == "qwen3-tiny-no-config"


def test_first_layers_checkpoint(tmp_path) -> None:
    """The layer-skip draft keeps the embeddings, the final norm, the head and the first layers' weights only, is
    made once per source and depth, and refuses a depth it cannot cut to."""
    from safetensors import safe_open

    from nanovllm_ref.oracle.derived import first_layers_checkpoint

    path = first_layers_checkpoint(GQA4.path, 1, tmp_path)
    assert first_layers_checkpoint(GQA4.path, 1, tmp_path) == path
    with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as st:
        keys = set(st.keys())
    with safe_open(os.path.join(GQA4.path, "model.safetensors"), framework="pt") as st:
        want = {k for k in st.keys() if ".layers." not in k or ".layers.0." in k}
    assert keys == want and any(".layers.0." in k for k in keys)
    for bad in (0, 3, 9):  # qwen3-gqa4 has 3 layers
        with pytest.raises(ValueError, match="num_layers"):
            first_layers_checkpoint(GQA4.path, bad, tmp_path)


def test_option_config() -> None:
    assert option_config(None) is None
    assert option_config('{"model": "/d", "num_speculative_tokens": 2}') == (
        "option-draft-k2", {"speculative_config": {"model": "/d", "num_speculative_tokens": 2}})
    for bad in ("{}", "[1]", "{nope"):
        with pytest.raises(ValueError):
            option_config(bad)


def test_counts_and_their_lines() -> None:
    run = SpecCounts(130, 60, 50) - SpecCounts(30, 10, 10)
    assert (run.acceptance_rate, run.mean_acceptance_length) == (0.5, 2.25)
    assert SpecCounts(5, 1) - SpecCounts(1, 0, 3) == SpecCounts(4, 1, None)
    meta = {"model": "m", "dtype": "float32", "config": "ngram-k3", "case": "goldens", "num_draft_tokens": 100,
            "num_accepted_tokens": 50, "num_drafts": 40, "acceptance_rate": 0.5, "mean_acceptance_length": 2.25}
    assert summary_lines([meta], verbose=True)[0] == (
        "m/float32 ngram-k3, goldens: 50/100 drafts accepted (0.500), mean acceptance length 2.25")
    assert len(summary_lines([{**meta, "case": "x" * 200}], verbose=True)[0]) == 120
    bare = {k: meta[k] for k in ("model", "dtype", "config", "case")}
    assert "no counts reported" in summary_lines([bare], verbose=True)[0]
    # by default one line per checkpoint and config, its runs summed: 80 + 50 of 100 + 200, 40 + 60 verifications
    other = {**meta, "dtype": "bfloat16", "case": "seeds", "num_draft_tokens": 200, "num_accepted_tokens": 80,
             "num_drafts": 60}
    assert summary_lines([meta, other, {**meta, "config": "ngram-k1"}]) == [
        "m ngram-k3, 2 runs (-v: each): 130/300 drafts accepted (0.433), mean acceptance length 2.30",
        "m ngram-k1, 1 runs (-v: each): 50/100 drafts accepted (0.500), mean acceptance length 2.25"]
    assert "no counts reported" in summary_lines([bare])[0]


def test_speculation_problems() -> None:
    spec = SpecConfig(TINY, "draft-self-k3", {"speculative_config": {"model": TINY.path, "num_speculative_tokens": 3}})
    assert speculation_problems(None, spec, "x") == []  # nothing reported: nothing to check
    assert "no draft token was proposed" in speculation_problems(SpecCounts(0, 0), spec, "x")[0]
    assert "none of 10 draft tokens was accepted" in speculation_problems(SpecCounts(10, 0), spec, "x")[0]
    assert speculation_problems(SpecCounts(100, 97), spec, "x") == []
    assert "0.970 < 0.98" in speculation_problems(SpecCounts(100, 97), spec, "x", self_acceptance=True)[0]
    ngram = SpecConfig(TINY, "ngram-k3", {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}})
    assert speculation_problems(SpecCounts(100, 10), ngram, "x", self_acceptance=True) == []


def _c(tokens, text="t", logprobs=None, finish="length") -> Completion:
    return Completion(list(tokens), finish, logprobs if logprobs is not None else [{t: -1.0} for t in tokens],
                      text=text)


def test_first_difference() -> None:
    want = _c([1, 2, 3], logprobs=[{1: -0.1}, {2: -0.5, 7: -0.50001}, {3: -0.2}])
    assert first_difference(_c([1, 2, 3]), want, 1e-4) is None
    assert first_difference(_c([1, 7, 9]), want, 1e-4) is None  # a near tie in the run without speculation
    assert "token 1: 7" in first_difference(_c([1, 7, 9]), want, 1e-6)
    assert "2 tokens, without speculation 3" in first_difference(_c([1, 2]), want, 1e-4)
    assert "text 'u'" in first_difference(_c([1, 2, 3], text="u"), want, 1e-4)
    assert "4 logprobs entries for 3 tokens" in first_difference(_c([1, 2, 3], logprobs=[{}] * 4), want, 1e-4)
