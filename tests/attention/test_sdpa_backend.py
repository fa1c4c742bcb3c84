"""The `sdpa` attention backend (the CPU default) against the pure-torch reference, the kernel oracle.

Paged batches from nanovllm_ref.testing: decode, fresh prompts, cached prefixes and chunks mixed, every GQA
ratio and block size, with unused cache blocks and rows past each context poisoned (NaN or large garbage), so
a backend that lets a masked key's value into the sum fails. (The whole engine against the torch backend:
tests/attention/test_backends_end_to_end.py::test_engine_matches_torch_backend.)
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from nanovllm_ref import LLM, SamplingParams
from nanovllm_ref.attention import AttentionMetadata, resolve_backend_name
from nanovllm_ref.attention.sdpa_backend import SdpaBackend
from nanovllm_ref.kernels.prefill_attention import prefill_attention_reference
from nanovllm_ref.testing import RELATIVE_TOLERANCE, make_paged_batch, paged_batches, relative_error

from ..conftest import QWEN3, checkpoint_path


def _run_backend(b) -> torch.Tensor:
    meta = AttentionMetadata(slot_mapping=b.slot_mapping.long(), query_start_loc=b.query_start_loc,
                             seq_lens=b.seq_lens, block_tables=b.block_tables, max_query_len=max(b.query_lens),
                             max_seq_len=max(b.context_lens))
    backend = SdpaBackend(b.num_heads, b.num_kv_heads, b.head_dim, b.scale)
    k_cache, v_cache = b.poisoned_caches()
    backend.store_kv(b.key, b.value, k_cache, v_cache, meta)
    torch.testing.assert_close(k_cache, b.k_cache, equal_nan=True)
    torch.testing.assert_close(v_cache, b.v_cache, equal_nan=True)
    return backend.forward(b.q, k_cache, v_cache, meta)


def _check(b) -> None:
    ref = prefill_attention_reference(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens,
                                      b.block_tables, b.scale)
    out = _run_backend(b)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert out.isfinite().all(), "sdpa backend let a poisoned (unused) cache entry into the output"
    err = relative_error(out, ref)
    assert err < RELATIVE_TOLERANCE[b.q.dtype], (err, b.context_lens, b.query_lens, b.block_size, b.group)


@settings(max_examples=40, deadline=None)
@given(b=paged_batches(head_dims=(32, 64, 96), max_seqs=5, max_context=300, decode_only=True,
                       dtype=(torch.float32, torch.bfloat16), poison=("nan", "large")))
def test_sdpa_decode_matches_reference(b):
    _check(b)


@settings(max_examples=40, deadline=None)
@given(b=paged_batches(head_dims=(32, 64, 96), max_seqs=5, max_context=300,
                       dtype=(torch.float32, torch.bfloat16), poison=("nan", "large")))
def test_sdpa_prefill_matches_reference(b):
    _check(b)


@pytest.mark.parametrize("case", [
    ([300, 1, 700, 256], [1, 1, 1, 1]),  # decode of very different context lengths
    ([300, 20, 700, 513], [300, 20, 5, 1]),  # prompt, chunk over a cached prefix, a decode mixed in
    ([300, 20, 7, 513], [300, 20, 7, 513]),  # fresh prompts only (SDPA's own causal mask)
])
def test_sdpa_fixed_cases(case):
    ctx_lens, q_lens = case
    _check(make_paged_batch(ctx_lens, q_lens, num_kv_heads=2, group=4, head_dim=64, block_size=16, seed=3))


def test_auto_backend_on_cpu_is_sdpa():
    assert resolve_backend_name("auto", "cpu") == "sdpa"


def test_sdpa_plans_once_per_step_for_all_layers(monkeypatch):
    import nanovllm_ref.attention.sdpa_backend as sb

    calls = []
    orig = sb.make_plan
    monkeypatch.setattr(sb, "make_plan", lambda *a: calls.append(a) or orig(*a))
    llm = LLM(str(checkpoint_path(QWEN3)), dtype="float32", attention_backend="sdpa")
    layers = llm.engine.hf_config.num_hidden_layers
    assert layers > 1
    runner, forwards = llm.engine.runner, []
    compute = runner.compute_hidden
    runner.compute_hidden = lambda *a, **k: forwards.append(1) or compute(*a, **k)
    llm.generate([[5, 6, 7], [8] * 9], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(forwards) >= 3 and len(calls) == len(forwards)  # one plan per step, whatever the number of layers


def test_sdpa_decode_steps_extend_the_gathered_context(monkeypatch):
    """A decode step that continues the previous one appends its token to each layer's gathered keys instead of
    gathering the context again; a row now holding another sequence (same length) or a new block past the room
    left gathers afresh. Every step equals the reference; unused cache entries are NaN."""
    import nanovllm_ref.attention.sdpa_backend as sb

    gathered, orig = [], sb.Plan.context_rows  # a decode step gathers its context through this
    monkeypatch.setattr(sb.Plan, "context_rows", lambda *a: gathered.append(step) or orig(*a))
    gen = torch.Generator().manual_seed(0)
    bs, kvh, group, d, num_blocks = 4, 2, 3, 8, 64
    k_cache = torch.full((num_blocks, bs, kvh, d), float("nan"))
    v_cache = k_cache.clone()
    free = torch.randperm(num_blocks, generator=gen).tolist()
    lens, tables = [5, 9, 1], [[], [], []]
    for s, n in enumerate(lens):  # the prompts' keys, already in the cache
        tables[s] = [free.pop() for _ in range(-(-n // bs))]
        for p in range(n):
            k_cache[tables[s][p // bs], p % bs] = torch.randn(kvh, d, generator=gen)
            v_cache[tables[s][p // bs], p % bs] = torch.randn(kvh, d, generator=gen)
    backend = SdpaBackend(kvh * group, kvh, d, d**-0.5)
    for step in range(14):
        if step == 6:  # row 1 now holds another sequence of the same length (its blocks copied elsewhere)
            copy = [free.pop() for _ in tables[1]]
            k_cache[copy], v_cache[copy] = k_cache[tables[1]], v_cache[tables[1]]
            k_cache[copy[-1], lens[1] % bs - 1] += 1.0  # ...whose last key differs
            tables[1] = copy
        slots = []
        for s in range(len(lens)):
            if lens[s] % bs == 0:
                tables[s].append(free.pop())
            slots.append(tables[s][lens[s] // bs] * bs + lens[s] % bs)
            lens[s] += 1
        width = max(map(len, tables))
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots), query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32),
            seq_lens=torch.tensor(lens, dtype=torch.int32), max_query_len=1, max_seq_len=max(lens),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32))
        q = torch.randn(len(lens), kvh * group, d, generator=gen)
        backend.store_kv(torch.randn(len(lens), kvh, d, generator=gen), torch.randn(len(lens), kvh, d, generator=gen),
                         k_cache, v_cache, meta)
        out = backend.forward(q, k_cache, v_cache, meta)
        ref = prefill_attention_reference(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                          meta.block_tables, backend.scale)
        assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.float32], step
    assert 0 in gathered and 6 in gathered and len(set(gathered)) <= 5, sorted(set(gathered))


def test_sdpa_decode_continuation_survives_metadata_reused_in_place():
    """The check that a decode step continues the previous one must compare against the previous step's block
    tables as they were: an engine may write the next step's tables into the same tensor. Here the second step
    moves row 0 to other blocks holding a different key, in place in the same tensors; its output must still be
    the reference's (the stale gathered context would not be)."""
    gen = torch.Generator().manual_seed(1)
    bs, kvh, group, d = 4, 2, 2, 8
    k_cache, v_cache = torch.randn(16, bs, kvh, d, generator=gen), torch.randn(16, bs, kvh, d, generator=gen)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    lens = torch.tensor([9, 10], dtype=torch.int32)
    backend = SdpaBackend(kvh * group, kvh, d, d**-0.5)
    for step in range(2):
        if step == 1:  # row 0 now in blocks 6-8, one key changed; the same tables tensor, written in place
            k_cache[6:9], v_cache[6:9] = k_cache[0:3], v_cache[0:3]
            k_cache[6, 1] += 1.0
            tables[0] = torch.tensor([6, 7, 8], dtype=torch.int32)
            lens = lens + 1
        slots = (tables[torch.arange(2), (lens - 1) // bs].long() * bs + (lens - 1) % bs)
        meta = AttentionMetadata(slot_mapping=slots, query_start_loc=torch.arange(3, dtype=torch.int32),
                                 seq_lens=lens, block_tables=tables, max_query_len=1, max_seq_len=int(lens.max()))
        q = torch.randn(2, kvh * group, d, generator=gen)
        backend.store_kv(torch.randn(2, kvh, d, generator=gen), torch.randn(2, kvh, d, generator=gen),
                         k_cache, v_cache, meta)
        out = backend.forward(q, k_cache, v_cache, meta)
        ref = prefill_attention_reference(q, k_cache, v_cache, meta.query_start_loc, lens, tables, backend.scale)
        assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.float32], step


def test_sdpa_decode_step_after_a_verify_step_gathers_afresh():
    """A speculative verify step's rows are one sequence side by side, and the step after rewrites the keys of its
    rejected rows: a decode step must not extend them even where its rows look like the verify rows one token on
    (the same tables, every length + 1: here the second row reads the same blocks, as a prefix-cache hit could).
    The rejected draft's key at slot 9 is rewritten by the decode step; the output must be the reference's."""
    gen = torch.Generator().manual_seed(2)
    bs, kvh, group, d = 4, 2, 2, 8
    k_cache, v_cache = torch.randn(8, bs, kvh, d, generator=gen), torch.randn(8, bs, kvh, d, generator=gen)
    tables = torch.tensor([[0, 1, 2], [0, 1, 2]], dtype=torch.int32)
    backend = SdpaBackend(kvh * group, kvh, d, d**-0.5)
    for step, lens in enumerate([torch.tensor([9, 10], dtype=torch.int32), torch.tensor([10, 11], dtype=torch.int32)]):
        slots = (lens - 1).long()  # blocks 0-2 in order: position p at slot p
        meta = AttentionMetadata(slot_mapping=slots, query_start_loc=torch.arange(3, dtype=torch.int32),
                                 seq_lens=lens, block_tables=tables, max_query_len=1, max_seq_len=int(lens.max()),
                                 verifies_drafts=step == 0)
        q = torch.randn(2, kvh * group, d, generator=gen)
        backend.store_kv(torch.randn(2, kvh, d, generator=gen), torch.randn(2, kvh, d, generator=gen),
                         k_cache, v_cache, meta)
        out = backend.forward(q, k_cache, v_cache, meta)
        ref = prefill_attention_reference(q, k_cache, v_cache, meta.query_start_loc, lens, tables, backend.scale)
        assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.float32], step
