"""Penalties, logit bias, min_tokens, min-p, logprobs modes, n and stop strings in the engine.

The torch processing path is held to transformers' processors exactly on random logits; the engine's n,
seeds, prefix-cache sharing, batch independence with async scheduling, and the incremental detokenizer."""

from __future__ import annotations

import pytest
import torch

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.engine.detokenizer import IncrementalDetokenizer
from nanovllm_ref.layers.logits_processing import process_logits
from nanovllm_ref.layers.sampler import SamplingBatch
from nanovllm_ref.oracle.sampling_reference import process
from nanovllm_ref.sampling_params import ProcessedRow

from ..conftest import QWEN3, checkpoint_path

CASES = [
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.6, min_p=0.05),
    dict(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.7),
    dict(repetition_penalty=0.8, temperature=0.0, logit_bias={3: 2.5, 7: -1.0}),
    dict(min_tokens=3, logit_bias={0: 10.0}, stop_token_ids=[5]),
    dict(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02, frequency_penalty=-0.5, logit_bias={1: 1.0}),
]


@pytest.fixture(scope="module")
def llm():
    # async scheduling as on a GPU: plain rows launched ahead next to rows the host samples
    return LLM(str(checkpoint_path(QWEN3)), dtype="float32", max_model_len=256, async_scheduling=True)


def test_processing_path_equals_transformers_processors() -> None:
    """Random logits, prompts and histories: the engine's processed scores are transformers' exactly."""
    gen = torch.Generator().manual_seed(0)
    vocab, rows, expected = 64, [], []
    logits = torch.randn(len(CASES), vocab, generator=gen) * 3
    for i, kw in enumerate(CASES):
        params = SamplingParams(**kw)
        prompt = torch.randint(0, vocab, (9,), generator=gen).tolist()
        history = torch.randint(0, vocab, (i,), generator=gen).tolist()
        tokens = prompt + history
        rows.append(ProcessedRow(i, params, tokens, len(prompt), frozenset(params.stop_token_ids) | {0}))
        expected.append(process(logits[i], prompt, history, kw, eos=[0]))
    batch = SamplingBatch(torch.tensor([float(r.params.temperature) for r in rows]),
                          torch.tensor([r.params.top_k for r in rows]), torch.tensor([r.params.top_p for r in rows]),
                          torch.zeros(len(rows), dtype=torch.int64), torch.zeros(len(rows), dtype=torch.int64), True)
    got = process_logits(logits, rows, batch)
    for i, kw in enumerate(CASES):
        assert torch.equal(torch.isinf(got[i]), torch.isinf(expected[i])), kw
        assert torch.allclose(got[i][torch.isfinite(got[i])], expected[i][torch.isfinite(expected[i])],
                              rtol=1e-6, atol=1e-6), kw


def test_sample_i_of_n_is_the_request_with_seed_plus_i_and_shares_the_prompt_blocks(llm) -> None:
    prompt = list(range(40, 80))  # 40 tokens: 2 full blocks of 16
    params = dict(temperature=1.0, max_tokens=5, ignore_eos=True)
    bm = llm.engine.block_manager
    llm.reset_prefix_cache()
    hits = bm.num_hits
    out = llm.generate([prompt], SamplingParams(n=4, seed=2**64 - 2, **params), use_tqdm=False)[0]
    assert bm.num_hits - hits == 3 * 2  # samples 1-3 took both full prompt blocks from sample 0's prefill
    alone = [llm.generate([prompt], SamplingParams(seed=s, **params), use_tqdm=False)[0].token_ids
             for s in (2**64 - 2, 2**64 - 1, 0, 1)]  # seed + i wraps around 2^64
    assert [c.token_ids for c in out.outputs] == alone and out.token_ids == alone[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]


def test_penalized_and_plain_requests_do_not_change_each_other(llm) -> None:
    """Plain rows keep the fused path (and async scheduling when alone); mixing in penalized rows changes no
    request's tokens, seeded either way."""
    plain = [SamplingParams(temperature=1.0, seed=s, max_tokens=12, ignore_eos=True) for s in range(4)]
    special = [SamplingParams(temperature=0.8, seed=9, max_tokens=12, ignore_eos=True, repetition_penalty=1.3,
                              presence_penalty=0.5, min_p=0.05, logit_bias={17: 1.0}, min_tokens=4)]
    prompts = [[5 + i, 6, 7, 8] for i in range(5)]
    alone_plain = [o.token_ids for o in llm.generate(prompts[:4], plain, use_tqdm=False)]
    alone_special = llm.generate(prompts[4:], special, use_tqdm=False)[0].token_ids
    mixed = [o.token_ids for o in llm.generate(prompts, plain + special, use_tqdm=False)]
    assert mixed == alone_plain + [alone_special]


def test_logprobs_modes(llm) -> None:
    prompt = [11, 12, 13, 14]
    base = dict(temperature=0.7, top_k=3, max_tokens=1, seed=3, logprobs=5)
    raw = llm.generate([prompt], SamplingParams(**base), use_tqdm=False)[0].logprobs[0]
    logits = llm.generate([prompt], SamplingParams(logprobs_mode="raw_logits", **base), use_tqdm=False)[0].logprobs[0]
    proc = llm.generate([prompt], SamplingParams(logprobs_mode="processed_logprobs", **base),
                        use_tqdm=False)[0].logprobs[0]
    shift = {round(logits[t] - raw[t], 4) for t in raw}
    assert len(shift) == 1  # logits - logprobs = the log-partition, one constant
    finite = {t: v for t, v in proc.items() if v > float("-inf")}
    assert len(finite) == 3 and abs(sum(torch.tensor(list(finite.values())).exp()) - 1) < 1e-5
    top3 = sorted(raw, key=raw.get, reverse=True)[:3]
    assert set(finite) == set(top3)


def test_abort_of_n_samples_ends_them_all(llm) -> None:
    rid = llm.add_request([5, 6, 7], SamplingParams(n=3, max_tokens=50, ignore_eos=True))
    llm.step()
    out = llm.abort_request(rid)
    assert [c.finish_reason for c in out.outputs] == ["abort"] * 3 and not llm.has_unfinished()
    assert llm.abort_request(rid) is None


def test_stop_strings_and_min_tokens_in_the_engine(llm) -> None:
    prompt = llm.tokenizer.encode("def __init__(self, x):\n    self.x = x\n    self.")
    greedy = dict(temperature=0.0, max_tokens=16, ignore_eos=True)
    text = llm.generate([prompt], SamplingParams(**greedy), use_tqdm=False)[0].text
    stop = text[3:6]
    out = llm.generate([prompt], SamplingParams(stop=[stop, "never"], **greedy), use_tqdm=False)[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (text[:3], "stop", stop)
    out = llm.generate([prompt], SamplingParams(stop=stop, include_stop_str_in_output=True, **greedy),
                       use_tqdm=False)[0]
    assert out.text == text[:6]
    # a stop string completed by the last allowed token still makes the reason "stop", as in vLLM
    tokens = llm.generate([prompt], SamplingParams(**greedy), use_tqdm=False)[0].token_ids
    last = llm.tokenizer.decode(tokens[:4])
    out = llm.generate([prompt], SamplingParams(stop=last[-2:], **{**greedy, "max_tokens": 4}), use_tqdm=False)[0]
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", last[-2:], last[:-2]), (out, last)
    # a stop string met before min_tokens does not stop the request
    late = llm.generate([prompt], SamplingParams(stop=stop, min_tokens=15, **greedy), use_tqdm=False)[0]
    assert len(late.token_ids) >= 15


@pytest.fixture(scope="module")
def tokenizer(llm):
    return llm.tokenizer


def test_detokenizer_streams_whole_characters_that_concatenate_to_the_text(tokenizer) -> None:
    text = "x = 'h\u00e9llo w\u00f6rld \U0001f642 \u4e2d\u6587' # \u00fcn\u00efcode\n"
    ids = tokenizer.encode(text)
    split = [c for c in "\U0001f642\u4e2d" if len(tokenizer.encode(c)) > 1]
    assert split, "the test needs a character the tokenizer splits over several tokens"
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams())
    pieces = []
    for t in ids:
        detok.add([t])
        pieces.append(detok.stream())
        assert "\ufffd" not in pieces[-1]
    pieces.append(detok.stream(finished=True))
    assert "".join(pieces) == detok.text == tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("include", [False, True])
def test_detokenizer_finds_a_stop_string_across_tokens_and_never_streams_past_it(tokenizer, include) -> None:
    text = "for item in items:\n    print(item)\n"
    ids = tokenizer.encode(text)
    pieces_of = [tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    cut = next(len(p) for p in pieces_of[2:] if 1 < len(p) < len(text) - 2)
    stop = text[cut - 2 : cut + 2]  # spans the boundary between two tokens
    detok = IncrementalDetokenizer(tokenizer, [], SamplingParams(stop=stop, include_stop_str_in_output=include))
    streamed, found = "", None
    for t in ids:
        found = detok.add([t])
        streamed += detok.stream()
        if found:
            break
    end = text.find(stop) + (len(stop) if include else 0)
    assert found == stop and detok.text == text[:end] and streamed == text[:end]
