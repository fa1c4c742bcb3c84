"""Stateful model of the scheduler, driven by a fake model step over a simulated paged KV cache.

Each step does what the engine does: `schedule()`, `prepare_step()`, run the model, `update()`. The fake
model writes each scheduled token into its KV slot, and a sampling sequence reads its whole context back
through its block table; the next token is a hash of that context, so a request's output is fixed by its
prompt alone and any scheduling slip (lost tokens, wrong slots, stale prefix-cache content) shows up.
`step_async` runs steps as the engine's async scheduling does (engine/overlap.py): the step behind the one in flight
is scheduled (OverlapScheduler.take_in_flight, then `schedule()`) and run before the one in flight is applied, the input
ids the host does not know gathered from that step's samples by `gather_rows` (as the device does); rows that finish
meanwhile compute a token that is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from nanovllm_ref.engine.block_manager import BlockManager
from nanovllm_ref.engine.inputs import StepInput, prepare_step
from nanovllm_ref.engine.overlap import OverlapScheduler, gather_rows
from nanovllm_ref.engine.scheduler import SchedulerOutput
from nanovllm_ref.engine.sequence import Sequence, SequenceStatus
from nanovllm_ref.sampling_params import SamplingParams

from .prop_common import (
    EOS,
    PROMPT_TOKENS,
    build_prompt,
    check,
    fake_next_token,
    guarded,
    is_stop,
    name,
    rarely,
    reference_output,
)
from .prop_invariants import check_block_manager
from .prop_sched_checks import check_schedule, check_step_input


@dataclass
class Request:
    seq: Sequence
    expected: list[int]  # prompt + every token sampled so far, kept by the test
    reference: list[int]  # the output the request must produce if it runs to the end
    ended: str | None = None  # "finished", "abort" or "error"


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sched: OverlapScheduler | None = None  # (with nothing in flight, the plain Scheduler)
        self.requests: list[Request] = []
        self.kv: dict[int, int] = {}  # slot -> token whose KV the fake model wrote there
        self.num_steps = 0
        self.clean = True  # False once a rule or check raised: teardown then skips the drain
        # async: scheduled ahead and run, not applied (its schedule, samples and inputs)
        self.ahead: tuple[SchedulerOutput, dict[int, int], StepInput] | None = None

    def __repr__(self) -> str:
        if self.sched is None:
            return "SchedulerMachine(uninitialized)"
        s = self.sched
        return (f"SchedulerMachine(step={self.num_steps}, waiting={[name(q) for q in s.waiting]}, "
                f"running={[name(q) for q in s.running]}, free_blocks={s.block_manager.num_free_blocks})")

    @initialize(block_size=st.integers(1, 4), num_blocks=st.integers(1, 16), max_num_seqs=st.integers(1, 4),
                max_num_batched_tokens=st.integers(1, 16), max_model_len=st.integers(4, 48),
                prefix_caching=st.sampled_from([True, True, False]))
    def setup(self, block_size: int, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
              max_model_len: int, prefix_caching: bool) -> None:
        bm = BlockManager(num_blocks, block_size, prefix_caching)
        self.sched = OverlapScheduler(bm, max_num_seqs, max_num_batched_tokens, max_model_len, frozenset({EOS}))

    # ---- helpers ---------------------------------------------------------------------------------
    def _live(self) -> list[Request]:
        return [r for r in self.requests if r.ended is None]

    def _state(self) -> tuple:
        s, bm = self.sched, self.sched.block_manager
        return ([q.seq_id for q in s.waiting], [q.seq_id for q in s.running], list(bm.free_queue),
                dict(bm.cached), [b.ref_count for b in bm.blocks], s.num_preemptions)

    def _scheduled_and_run(self, out: SchedulerOutput, waiting_before: list[Sequence],
                           prev: tuple[dict[int, int], StepInput] | None = None) -> tuple[dict[int, int], StepInput]:
        s, bs = self.sched, self.sched.block_manager.block_size
        self.num_steps += 1
        check_schedule(s, out, waiting_before)
        step = prepare_step(out, bs)
        check_step_input(s, out, step, bs)
        return self._fake_model(out, step, prev), step

    def _run_step(self, fail: int | None = None, ahead: bool = False) -> None:
        """One engine step; `fail` picks a scheduled sequence that errors mid-step (finished with "error"). With
        `ahead` (async scheduling), the step behind it is scheduled and run before it is applied."""
        s = self.sched
        if self.ahead is not None:
            (out, sampled, step), self.ahead = self.ahead, None
        else:
            had_work, waiting_before = s.has_unfinished(), list(s.waiting)
            out = s.schedule()
            check(bool(out.scheduled) or not had_work, "progress", "requests pending but nothing scheduled")
            self._check_tokens()  # preemption happens inside schedule(): no token may be lost or changed
            sampled, step = self._scheduled_and_run(out, waiting_before)
        if ahead:
            waiting_before = list(s.waiting)
            s.take_in_flight(out)
            behind = s.schedule()
            if behind.scheduled:
                self.ahead = (behind, *self._scheduled_and_run(behind, waiting_before, (sampled, step)))
        failed = None
        live = [q for q, _ in out.scheduled if not q.is_finished]
        if fail is not None and live:
            failed = live[fail % len(live)]
            s.finish(failed, "error")
            sampled.pop(failed.seq_id, None)
            self._request(failed).ended = "error"
        finished = s.update(out, sampled)  # (rows finished in flight: the scheduler drops their tokens)
        sampled = {i: t for i, t in sampled.items() if not self._by_id(i).is_finished or self._by_id(i) in finished}
        self._record(out, sampled, finished)
        self._check_tokens()
        if self.ahead is not None and all(q.is_finished for q, _ in self.ahead[0].scheduled):
            self.ahead = None
        names = {q.seq_id: name(q) for q, _ in out.scheduled}
        note(f"step {self.num_steps}: scheduled {[(name(q), n) for q, n in out.scheduled]}, preempted "
             f"{[name(q) for q in out.preempted]}, sampled { {names[i]: t for i, t in sampled.items()} }, "
             f"error {failed and name(failed)}, finished {[name(q) for q in finished]}")

    def _check_tokens(self) -> None:
        for req in self.requests:
            check(req.seq.token_ids == req.expected, "tokens-preserved",
                  f"{name(req.seq)} has tokens {req.seq.token_ids}, want {req.expected}")

    def _request(self, seq: Sequence) -> Request:
        return next(r for r in self.requests if r.seq is seq)

    def _by_id(self, seq_id: int) -> Sequence:
        return next(r.seq for r in self.requests if r.seq.seq_id == seq_id)

    def _fake_model(self, out: SchedulerOutput, step: StepInput, prev: tuple[dict[int, int], StepInput] | None = None,
                    ) -> dict[int, int]:
        """Write the step's KV, then sample each sampling sequence from the context it reads back. The input ids the
        host does not know are gathered as the device does (gather_rows) from the tokens of `prev`, the step in flight
        (its samples and inputs); the KV and context checks catch a row fed another row's token."""
        bm = self.sched.block_manager
        bs = bm.block_size
        input_ids = list(step.input_ids)
        rows = None if prev is None else gather_rows(out, step, prev[1])
        if rows is not None:  # the device's buffer of the step in flight's tokens, in its sampling rows' order
            source = input_ids + [prev[0][seq_id] for seq_id in prev[1].sample_seq_ids]
            input_ids = [source[r] for r in rows]
        check(len(input_ids) == step.num_tokens, "pending",
              f"{step.num_tokens - len(input_ids)} input ids neither known nor gathered: {step.input_ids}")
        for slot, token in zip(step.slot_mapping, input_ids):
            block = bm.blocks[slot // bs]
            check(block.ref_count == 1 and block.hash is None, "kv-write",
                  f"writing slot {slot} of block {block.block_id} shared by {block.ref_count} or already cached")
            self.kv[slot] = token
        sampled = {}
        for i, (seq, num_new) in enumerate(out.scheduled):
            if not out.samples(seq, num_new):
                continue
            table, seq_len = seq.block_table, step.seq_lens[i]
            context = [self.kv.get(table[p // bs] * bs + p % bs) for p in range(seq_len)]
            # the tokens known on the host, then the one the step in flight samples (a pending one, or the next one
            # of a decode step claimed ahead)
            tokens = list(seq.token_ids)
            if seq_len > len(tokens):
                tokens.append(prev[0][seq.seq_id])
            check(context == tokens, "kv-content", f"{name(seq)} attends to {context} but its tokens are {tokens}")
            sampled[seq.seq_id] = fake_next_token(seq.seed, context)
        return sampled

    def _record(self, out: SchedulerOutput, sampled: dict[int, int], finished: list[Sequence]) -> None:
        """Keep the test's own copy of every request's tokens and check how requests finish."""
        eos = self.sched.eos_token_ids
        for seq, _ in out.scheduled:
            req = self._request(seq)
            if seq.seq_id not in sampled:
                continue
            token = sampled[seq.seq_id]
            req.expected.append(token)
            num_out = len(req.expected) - seq.num_prompt_tokens
            check(req.expected[seq.num_prompt_tokens :] == req.reference[:num_out], "output",
                  f"{name(seq)} produced {req.expected[seq.num_prompt_tokens:]}, reference {req.reference}")
            want = "stop" if is_stop(token, seq.params, eos) else "length" if num_out >= seq.params.max_tokens \
                else None
            check(seq.finish_reason == want and (seq in finished) == (want is not None), "finish",
                  f"{name(seq)} after {num_out}/{seq.params.max_tokens} tokens (last {token}): finish "
                  f"reason {seq.finish_reason!r}, want {want!r}")
            if want is not None:
                req.ended = "finished"

    # ---- rules -----------------------------------------------------------------------------------
    @rule(reuse=st.none() | st.integers(0, 31), cut=st.integers(0, 10), extra=st.lists(PROMPT_TOKENS, max_size=6),
          max_tokens=st.integers(1, 8), copies=st.integers(1, 3), stop=st.sampled_from([(), (), (3,)]),
          ignore_eos=st.booleans(), prompt_logprobs=st.sampled_from([None, None, None, 1]))
    @guarded
    def add_request(self, reuse: int | None, cut: int, extra: list[int], max_tokens: int, copies: int,
                    stop: tuple[int, ...], ignore_eos: bool, prompt_logprobs: int | None) -> None:
        """`copies` requests with one prompt arrive together; one that can never fit must be refused."""
        s, bm = self.sched, self.sched.block_manager
        prompt = build_prompt([tuple(r.expected) for r in self.requests], reuse, cut, extra)
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=stop, ignore_eos=ignore_eos,
                                prompt_logprobs=prompt_logprobs)
        need = len(prompt) + max_tokens
        fits = need <= s.max_model_len and bm.blocks_needed(need) <= bm.num_blocks
        for _ in range(copies):
            seq = Sequence(f"r{len(self.requests)}", prompt, params, seed=len(self.requests))
            before = self._state()
            try:
                s.check_fits(seq.num_prompt_tokens, max_tokens)  # as the engine validates a request, before add
                s.add(seq)
                accepted = True
            except ValueError:
                accepted = False
            note(f"add {name(seq) if accepted else '(refused)'}: prompt {prompt}, max_tokens {max_tokens}, "
                 f"stop {stop}, ignore_eos {ignore_eos}")
            check(accepted == fits, "refuse", f"a request of {need} tokens: accepted={accepted}, fits={fits}")
            if not accepted:
                check(self._state() == before, "refuse", "a refused request changed the scheduler state")
                return
            ref = reference_output(prompt, params, seq.seed, s.eos_token_ids)
            self.requests.append(Request(seq, list(prompt), ref))

    @rule(abort=rarely(16, percent=25), num_steps=st.integers(0, 6), fail=rarely(4, percent=10))
    @guarded
    def step(self, abort: int | None, num_steps: int, fail: int | None) -> None:
        """Maybe abort a live request (picked by index), then run steps; `fail` makes one request of the
        first step fail mid-step (as for non-finite logits), which finishes it with an error."""
        self._abort(abort)
        for i in range(num_steps):
            self._run_step(fail if i == 0 else None)

    @rule(abort=rarely(16, percent=25), num_steps=st.integers(1, 6), fail=rarely(4, percent=10))
    @guarded
    def step_async(self, abort: int | None, num_steps: int, fail: int | None) -> None:
        """The same with async scheduling: each step's successor is scheduled and run before it is applied."""
        self._abort(abort)
        for i in range(num_steps):
            self._run_step(fail if i == 0 else None, ahead=True)

    def _abort(self, abort: int | None) -> None:
        live = self._live()
        if abort is not None and live:
            req = live[abort % len(live)]
            self.sched.finish(req.seq, "abort")
            req.ended = "abort"
            note(f"abort {name(req.seq)}")

    # ---- invariants ------------------------------------------------------------------------------
    @invariant()
    @guarded
    def consistent(self) -> None:
        s = self.sched
        if s is None:
            return
        waiting, running = list(s.waiting), list(s.running)
        ids_w, ids_r = [q.seq_id for q in waiting], [q.seq_id for q in running]
        check(len(set(ids_w + ids_r)) == len(ids_w) + len(ids_r), "queues",
              f"a request is queued twice or both waiting and running: waiting {[name(q) for q in waiting]}, "
              f"running {[name(q) for q in running]}")
        in_waiting, in_running = set(ids_w), set(ids_r)
        check(len(running) <= s.max_num_seqs, "max-num-seqs", f"{len(running)} running > {s.max_num_seqs}")
        self._check_tokens()
        for req in self.requests:
            seq = req.seq
            where = SequenceStatus.WAITING if seq.seq_id in in_waiting else SequenceStatus.RUNNING \
                if seq.seq_id in in_running else SequenceStatus.FINISHED
            check(seq.status is where and (req.ended is None) == (where is not SequenceStatus.FINISHED), "queues",
                  f"{name(seq)} has status {seq.status} but is {where.value} ({req.ended})")
            if where is not SequenceStatus.RUNNING:
                check(not seq.block_table and seq.num_computed_tokens == 0, "blocks",
                      f"{name(seq)} ({where.value}) holds blocks {seq.block_table}")
            # between steps every token is known: the one a step in flight samples is pending only until applied
            check(seq not in s.in_flight, "pending", f"{name(seq)} has a token in flight between steps")
        check(s.counted is None, "pending", "a step counted as in flight between steps")
        check_block_manager(s.block_manager, running)

    def teardown(self) -> None:
        """Liveness: run every accepted request to the end within a bounded number of steps; nothing leaks."""
        s = self.sched
        if s is None or not self.clean:
            return
        bound = sum(r.seq.num_prompt_tokens + r.seq.params.max_tokens for r in self._live())
        steps = 0
        while s.has_unfinished():
            check(steps <= bound, "liveness", f"not done after {steps} steps (bound {bound})")
            self._run_step()
            self.consistent()
            steps += 1
        bm = s.block_manager
        check(bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks), "leak",
              f"{bm.num_blocks - bm.num_free_blocks} blocks still used after all requests ended")
        for req in self.requests:
            out = req.expected[req.seq.num_prompt_tokens :]
            check(req.ended is not None and req.seq.is_finished, "liveness", f"{name(req.seq)} never ended")
            if req.ended == "finished":
                check(out == req.reference, "output", f"{name(req.seq)}: {out}, reference {req.reference}")
