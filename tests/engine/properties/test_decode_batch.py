"""The vectorized steady-decode path (engine/decode_batch.py) against the general path, step by step.

Random workloads (prompt lengths, max_tokens, stop tokens, eos, ignore_eos, logprobs, tight KV caches that force
preemption, a max_num_seqs below the request count) run twice through scheduler + prepare_step + update with the
same fake tokens: once as the engine does, once with the fast path switched off. Every StepInput, every finished
request, every sequence's progress, blocks and block hashes, the prefix cache after every step and every final
token list must be identical, and the fast path must actually have been taken.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from nanovllm_ref import SamplingParams
from nanovllm_ref.engine.block_manager import BlockManager
from nanovllm_ref.engine.inputs import prepare_step
from nanovllm_ref.engine.scheduler import Scheduler
from nanovllm_ref.engine.sequence import Sequence

VOCAB, EOS = 50, 7


def _run(seed: int, fast: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list, int]:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    num_blocks = rng.randint(40, 400) // block_size + 8
    sched = Scheduler(BlockManager(num_blocks, block_size, enable_prefix_caching=rng.random() < 0.7),
                      max_num_seqs=rng.randint(2, 12), max_num_batched_tokens=rng.randint(8, 64), max_model_len=64,
                      eos_token_ids=frozenset({EOS}))
    seqs = []
    for i in range(rng.randint(1, 16)):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
        max_tokens = rng.randint(1, 64 - len(prompt))
        if -(-(len(prompt) + max_tokens) // block_size) > num_blocks:
            continue
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=rng.random() < 0.5,
                                stop_token_ids=[rng.randrange(VOCAB)] if rng.random() < 0.3 else [],
                                logprobs=rng.choice([None, 0, 3]), temperature=rng.choice([0.0, 0.7]))
        seqs.append(Sequence(f"r{i}", prompt, params, seed=i))
        sched.add(seqs[-1])
    if not fast:
        monkeypatch.setattr(sched, "_schedule_decodes", lambda: None)
    token_rng, trace, fast_steps = random.Random(seed + 1), [], 0
    list_rng = random.Random(seed + 2)  # whether the runner also hands the tokens over as a list
    names = {s.seq_id: s.request_id for s in seqs}
    while sched.has_unfinished():
        out = sched.schedule()
        fast_steps += out.decode_batch is not None
        step = prepare_step(out, block_size)
        sampled = {seq_id: token_rng.randrange(VOCAB) for seq_id in step.sample_seq_ids}
        tokens = [sampled[i] for i in step.sample_seq_ids] if fast and list_rng.random() < 0.5 else None
        finished = sched.update(out, sampled, tokens)
        fields = dict(vars(step), sample_seq_ids=[names[i] for i in step.sample_seq_ids])  # seq_ids differ per run
        array = fields.pop("block_table_array")  # block_tables as an array, for the runner
        fields = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in fields.items()}  # (general steps)
        if array is not None:
            width = max(map(len, step.block_tables))
            assert array.tolist() == [t + [0] * (width - len(t)) for t in step.block_tables]
        cache = sorted(sched.block_manager.cached.items())  # the prefix cache the decode steps filled
        trace.append((fields, [s.request_id for s in finished], [s.request_id for s in out.preempted], cache,
                      [(s.num_computed_tokens, s.block_table, s.block_hashes) for s in seqs]))
    trace.append([(s.request_id, s.token_ids, s.finish_reason) for s in seqs])
    return trace, fast_steps


@pytest.mark.parametrize("seed", range(40))
def test_decode_batch_matches_the_general_path(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        general, none = _run(seed, fast=False, monkeypatch=m)
    vectorized, fast_steps = _run(seed, fast=True, monkeypatch=monkeypatch)
    assert none == 0
    assert len(vectorized) == len(general)
    for i, (a, b) in enumerate(zip(vectorized, general)):
        assert a == b, f"seed {seed}: step {i} differs"
    if len(general) > 10:
        assert fast_steps > 0, "the fast path was never taken"
