"""Structured requests under everything the scheduler does: batches mixing constrained and plain requests, n > 1
(each sample its own matcher) and seeds, stop strings, the prefix cache, chunked prefill (only sampling rows get
masks), preemption and recompute (the matcher follows the tokens), async scheduling (steps with structured rows
are never launched behind another) and tensor parallelism (the bitmask travels in the StepInput)."""

from __future__ import annotations

import json
import re

import pytest

from golden.load import checkpoint_path
from nanovllm_ref import LLM, SamplingParams, StructuredOutputsParams

from .test_engine import REGEX

pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "enum": ["ab", "cd"]}}, "required": ["name"]}
PROMPT = list(range(3, 43))  # 40 tokens: two and a half blocks of 16
JSON_PROMPT = "import json\n\ndef f(data):\n    return json.dumps(data) + str([1, 2, 3])\n\nprint("  # (35 tokens)


def workload() -> tuple[list[list[int]], list[SamplingParams]]:
    """Constrained and plain requests, greedy and seeded, side by side."""
    regex = SamplingParams(temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(regex=REGEX))
    sampled = SamplingParams(temperature=1.0, seed=11, max_tokens=40,
                             structured_outputs=StructuredOutputsParams(regex=REGEX))
    schema = SamplingParams(temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=SCHEMA))
    plain = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain_sampled = SamplingParams(temperature=0.8, seed=5, max_tokens=30, ignore_eos=True)
    prompts = [PROMPT, PROMPT[:20], [7, 8, 9] * 9, JSON_PROMPT, [5, 6, 7, 8]]
    return prompts, [regex, plain, sampled, schema, plain_sampled]


def check(outs: list) -> None:
    regex, plain, sampled, schema, plain_sampled = outs
    for o in (regex, sampled):
        assert o.finish_reason == "stop" and re.fullmatch(REGEX, o.text), o.text
    assert schema.finish_reason == "stop" and json.loads(schema.text)["name"] in ("ab", "cd")
    assert len(plain.token_ids) == 24 and len(plain_sampled.token_ids) == 30


def tokens(outs: list) -> list[list[int]]:
    return [list(o.token_ids) for o in outs]


@pytest.fixture(scope="module")
def llm():
    with LLM(checkpoint_path("qwen3-tiny"), dtype="float32", max_model_len=256) as llm:
        yield llm


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    """Each request of the workload run by itself."""
    prompts, params = workload()
    return [tokens(llm.generate([p], sp, use_tqdm=False))[0] for p, sp in zip(prompts, params)]


def test_a_mixed_batch_gives_each_request_its_own_output(llm, alone):
    prompts, params = workload()
    llm.reset_prefix_cache()
    outs = llm.generate(prompts, params, use_tqdm=False)
    check(outs)
    assert tokens(outs) == alone
    assert llm.engine.structured.num_tracked == 0


def test_n_samples_each_follow_their_own_grammar_state(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=21, max_tokens=40,
                            structured_outputs=StructuredOutputsParams(regex=REGEX))
    [out] = llm.generate([PROMPT], params, use_tqdm=False)
    texts = [c.text for c in out.outputs]
    assert all(re.fullmatch(REGEX, t) for t in texts) and len(set(texts)) > 1, texts
    for i, c in enumerate(out.outputs):  # sample i draws as a request of its own with seed + i
        [single] = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=21 + i, max_tokens=40,
                                                         structured_outputs=params.structured_outputs), use_tqdm=False)
        assert single.token_ids == c.token_ids


def test_a_stop_string_cuts_the_constrained_text(llm, alone):
    full = llm.tokenizer.decode(alone[0])
    word = full.split(" ")[0]
    params = SamplingParams(temperature=0, max_tokens=40, stop=[" "], structured_outputs=StructuredOutputsParams(
        regex=REGEX))
    [out] = llm.generate([PROMPT], params, use_tqdm=False)
    assert out.finish_reason == "stop" and out.stop_reason == " " and out.text == word


def test_the_prefix_cache_serves_a_constrained_prompt(llm, alone):
    prompts, params = workload()
    llm.reset_prefix_cache()
    first = llm.generate(prompts[:1], params[:1], use_tqdm=False)[0]
    again = llm.generate(prompts[:1], params[:1], use_tqdm=False)[0]
    assert again.num_cached_tokens == 32 and first.num_cached_tokens == 0
    assert first.token_ids == again.token_ids == alone[0]


def test_chunked_prefill_masks_only_the_rows_that_sample(alone):
    prompts, params = workload()
    with LLM(checkpoint_path("qwen3-tiny"), dtype="float32", max_model_len=256, max_num_batched_tokens=16) as llm:
        steps = []
        launch = llm.engine.runner.launch
        llm.engine.runner.launch = lambda step, *a: steps.append(step) or launch(step, *a)
        outs = llm.generate(prompts, params, use_tqdm=False)
    check(outs)
    assert tokens(outs) == alone
    masked_seqs = set()
    for step in steps:
        assert step.num_tokens <= 16
        structured_rows = [r.row for r in step.processed if r.params.structured_outputs is not None]
        assert step.bitmask_rows == structured_rows  # every structured sampling row, and nothing else
        assert (step.bitmask is None) == (not structured_rows)
        assert step.bitmask is None or step.bitmask.shape == (len(structured_rows), 1536 // 32)
        masked_seqs |= {step.sample_seq_ids[r] for r in structured_rows}
    assert len(masked_seqs) == 3  # the three constrained requests (their chunks that do not sample have no row)


def test_preemption_and_recompute_keep_the_grammar_in_step(alone):
    prompts, params = workload()
    # 8 blocks of 16 tokens: the five requests need ~20 together, so the newest are preempted and recomputed
    with LLM(checkpoint_path("qwen3-tiny"), dtype="float32", max_model_len=128, num_kvcache_blocks=8) as llm:
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert llm.stats().num_preemptions > 0
        assert llm.engine.structured.num_tracked == 0
    check(outs)
    assert tokens(outs) == alone


def test_async_scheduling_runs_structured_steps_behind_no_other(alone):
    prompts, params = workload()
    with LLM(checkpoint_path("qwen3-tiny"), dtype="float32", max_model_len=256, async_scheduling=True) as llm:
        assert llm.engine.overlap is not None
        launches = []
        launch = llm.engine.runner.launch

        def record(step, prev=None, rows=None):
            launches.append((step.bitmask is not None, prev is not None))
            return launch(step, prev, rows)

        llm.engine.runner.launch = record
        outs = llm.generate(prompts, params, use_tqdm=False)
    check(outs)
    assert tokens(outs) == alone
    assert (True, True) not in launches  # a masked step never continues from tokens still on the device
    assert (False, True) in launches and (True, False) in launches  # (the plain steps after them did overlap)


def test_tensor_parallel_workers_get_the_bitmask(alone):
    prompts, params = workload()
    with LLM(checkpoint_path("qwen3-tiny"), dtype="float32", max_model_len=256, tensor_parallel_size=2) as llm:
        outs = llm.generate(prompts, params, use_tqdm=False)
    check(outs)
    assert tokens(outs) == alone
