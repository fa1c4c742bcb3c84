"""Per-step scheduler decisions, checked against the invariants a token-budget paged scheduler must keep.

An engine that can report its scheduling decisions (optional: the conformance workload uses it when the adapter
has ``observe_schedule(callback)``) hands one :class:`ScheduleDecision` per step to the callback;
:func:`check_decision` returns the violated invariants (empty when the step is sound):

* budget: every scheduled request gets >= 1 token, the step's tokens sum to at most
  ``max_num_batched_tokens``, at most ``max_num_seqs`` requests, none twice;
* chunks: a request is granted no token it does not know yet (``computed + new <= num_tokens``) and has
  blocks for all of them; a grant shorter than what the request has left (a prefill chunk) happens only when
  the step used the whole budget (chunks are cut by the budget, nothing else: vLLM v1 without
  ``long_prefill_token_threshold``);
* FCFS: the requests admitted from the waiting queue are its head, in order, and the queue stands in arrival
  order, preempted requests included (they are the newest running ones and go back to the front, as in
  vLLM): the oldest waiting request is never skipped for a younger one;
* blocks: a block held by two running requests sits at the same index of both tables over a prefix that is
  full, computed and token-for-token equal in both (a prefix-cache share); no table holds a block twice;
  preempted requests hold none; a block whose content the engine records holds the tokens of every request
  using it; where the engine reports reference counts, a held block's count is its number of holders and no
  other block is referenced (no leak).

nanovllm_ref reports them through ``Scheduler.on_schedule`` (:func:`nanovllm_ref_decision`). References:
vLLM v1 ``Scheduler.schedule`` (token budget, FCFS, prefix-cache block sharing by ref count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScheduledRequest:
    request_id: str
    num_new_tokens: int
    num_computed_tokens: int  # before this step (prefix-cache hits of this step included)
    token_ids: tuple[int, ...]  # prompt + generated so far
    block_table: tuple[int, ...]


@dataclass(frozen=True)
class ScheduleDecision:
    step: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    scheduled: tuple[ScheduledRequest, ...]
    waiting_before: tuple[str, ...]  # the waiting queue before the step, head first
    waiting_arrival: tuple[int, ...]  # their arrival order (any increasing numbers)
    running: tuple[ScheduledRequest, ...]  # every running request after the step (num_new_tokens 0 if idle)
    preempted: tuple[str, ...] = ()
    preempted_tables: tuple[tuple[int, ...], ...] = ()
    block_contents: dict[int, tuple[int, ...]] = field(default_factory=dict)  # block id -> tokens (if known)
    ref_counts: dict[int, int] = field(default_factory=dict)  # block id -> the engine's reference count (if any)


def check_decision(d: ScheduleDecision) -> list[str]:
    """The invariants ``d`` violates (see the module docstring); empty when none."""
    return [f"step {d.step}: {v}" for v in (*_budget(d), *_chunks(d), *_fcfs(d), *_blocks(d))]


def _budget(d: ScheduleDecision) -> list[str]:
    errors = []
    total = sum(r.num_new_tokens for r in d.scheduled)
    if total > d.max_num_batched_tokens:
        errors.append(f"{total} tokens scheduled > max_num_batched_tokens={d.max_num_batched_tokens}")
    if len(d.scheduled) > d.max_num_seqs:
        errors.append(f"{len(d.scheduled)} requests scheduled > max_num_seqs={d.max_num_seqs}")
    ids = [r.request_id for r in d.scheduled]
    if len(set(ids)) != len(ids):
        errors.append(f"a request scheduled twice: {ids}")
    errors += [f"request {r.request_id} granted {r.num_new_tokens} tokens" for r in d.scheduled
               if r.num_new_tokens < 1]
    return errors


def _chunks(d: ScheduleDecision) -> list[str]:
    errors = []
    budget_used = sum(r.num_new_tokens for r in d.scheduled) == d.max_num_batched_tokens
    for r in d.scheduled:
        end = r.num_computed_tokens + r.num_new_tokens
        if end > len(r.token_ids):
            errors.append(f"request {r.request_id}: computed {r.num_computed_tokens} + new {r.num_new_tokens} > "
                          f"{len(r.token_ids)} known tokens")
        if end > len(r.block_table) * d.block_size:
            errors.append(f"request {r.request_id}: {end} tokens but {len(r.block_table)} blocks of {d.block_size}")
        if end < len(r.token_ids) and not budget_used:
            left = len(r.token_ids) - r.num_computed_tokens
            errors.append(f"request {r.request_id} cut to {r.num_new_tokens} of {left} tokens while the budget "
                          f"({d.max_num_batched_tokens}) was not used up")
    return errors


def _fcfs(d: ScheduleDecision) -> list[str]:
    waiting = set(d.waiting_before)
    admitted = [r.request_id for r in d.scheduled if r.request_id in waiting]
    errors = []
    if admitted != list(d.waiting_before[: len(admitted)]):
        errors.append(f"admitted {admitted} but the waiting queue's head was {list(d.waiting_before[:len(admitted)])}")
    if list(d.waiting_arrival) != sorted(d.waiting_arrival):
        errors.append(f"the waiting queue is out of arrival order: {list(d.waiting_before)}")
    return errors


def _blocks(d: ScheduleDecision) -> list[str]:
    errors, holders = [], {}
    bs = d.block_size
    for r in d.running:
        if len(set(r.block_table)) != len(r.block_table):
            errors.append(f"request {r.request_id} holds a block twice: {list(r.block_table)}")
        for i, b in enumerate(r.block_table):
            holders.setdefault(b, []).append((r, i))
            known = d.block_contents.get(b)
            full = (i + 1) * bs <= r.num_computed_tokens
            if known is not None and full and known != r.token_ids[i * bs:(i + 1) * bs]:
                errors.append(f"block {b} (index {i} of request {r.request_id}) holds other tokens than the request's")
    for b, users in holders.items():
        (r0, i0), rest = users[0], users[1:]
        for r, i in rest:
            end = (i + 1) * bs
            if i != i0 or r.token_ids[:end] != r0.token_ids[:end] or min(
                    r.num_computed_tokens, r0.num_computed_tokens) < end:
                errors.append(f"block {b} used by requests {r0.request_id} (index {i0}) and {r.request_id} "
                              f"(index {i}) without a shared, full, computed prefix")
    for b, users in holders.items():
        if b in d.ref_counts and d.ref_counts[b] != len(users):
            errors.append(f"block {b} has reference count {d.ref_counts[b]} but {len(users)} running holders "
                          f"({[r.request_id for r, _ in users]})")
    leaked = sorted(b for b, n in d.ref_counts.items() if n > 0 and b not in holders)
    if leaked:
        errors.append(f"blocks {leaked} are referenced but held by no running request (leaked)")
    for rid, table in zip(d.preempted, d.preempted_tables):
        if table:
            errors.append(f"preempted request {rid} still holds blocks {list(table)}")
    return errors


def nanovllm_ref_decision(scheduler: Any, out: Any, waiting_before: list[Any], step: int) -> ScheduleDecision:
    """A :class:`ScheduleDecision` from nanovllm_ref's ``Scheduler.on_schedule(scheduler, out, waiting)``."""
    new = {seq.seq_id: n for seq, n in out.scheduled}

    def view(seq: Any) -> ScheduledRequest:
        return ScheduledRequest(seq.request_id, new.get(seq.seq_id, 0), seq.num_computed_tokens,
                                # -1: a token the step in flight samples (async scheduling)
                                tuple(seq.token_ids) + (-1,) * (scheduler.num_tokens(seq) - seq.num_tokens),
                                tuple(seq.block_table))

    bm = scheduler.block_manager
    contents = {b.block_id: b.token_ids for b in bm.blocks if b.hash is not None and b.ref_count > 0}
    counts = {b.block_id: b.ref_count for b in bm.blocks if b.ref_count > 0}
    return ScheduleDecision(
        step, scheduler.max_num_batched_tokens, scheduler.max_num_seqs, bm.block_size,
        tuple(view(seq) for seq, _ in out.scheduled), tuple(s.request_id for s in waiting_before),
        tuple(s.seq_id for s in waiting_before),
        tuple(view(seq) for seq in scheduler.running), tuple(s.request_id for s in out.preempted),
        tuple(tuple(s.block_table) for s in out.preempted), contents, counts)
