"""The engine loop: validate and add requests, then schedule -> run the model -> update, step by step (`_step`).

Async scheduling (`Config.async_scheduling`: by default on CUDA only; steps without logprobs or logits processing;
also under TP) runs the overlapped loop of overlap.py instead: the next step is scheduled and launched before the
current one's tokens are read back, its rows continuing from them taking them on the device (vLLM's async
scheduling, SGLang's overlap scheduler).

Bad input raises before any state changes (SamplingParams range-checks its fields when it is made, seeds to
64 bits; here the prompt, token ids and top_k are checked against the vocabulary and the request against the
cache); a failing request (non-finite logits) is finished with an error while the others go on; an exception
inside a step fails only that step's requests. Reading the checkpoint: loader.py; resolving the runner: config.py.

The public surface besides requests and `step()` (whose outputs, per request and per step, output_processor.py
builds): `stats()` (load: running, waiting, KV cache usage, preemptions), `reset_prefix_cache()`, and observers
(`add_observer`: `on_schedule(decision)` after every scheduling decision, as plain data: observers.py), so that
servers and tests read no scheduler or block manager.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import random

from ..config import Config, ModelConfig, resolve_spec
from ..loader import load_hf_config, load_tokenizer
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .block_manager import BlockManager
from .detokenizer import IncrementalDetokenizer, feed
from .inputs import prepare_step
from .model_runner import ModelRunner, StepOutput
from .observers import EngineStats, ScheduleObserver, SpecDecodingStats
from .output_processor import OutputProcessor
from .overlap import Overlap, OverlapScheduler
from .proposers import draft_reserve_of, make_proposer
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence
from .workers import TPExecutor, WorkersFailed


def eos_token_ids(path: str, model_config: ModelConfig) -> frozenset[int]:
    """The tokens that end a request: config.json's eos_token_id and generation_config.json's (as vLLM)."""
    sources = [model_config.eos_token_id]
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            sources.append(json.load(f).get("eos_token_id"))
    return frozenset(i for src in sources for i in ([src] if isinstance(src, int) else src or []))


class LLMEngine:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.proposer = None  # speculative decoding's (proposers.py), made once the runner is
        self.hf_config = load_hf_config(config.model)  # as transformers reads it (the server shows it)
        self.model_config = ModelConfig.from_hf(self.hf_config)
        self.spec = resolve_spec(config, self.model_config)
        self.tokenizer = load_tokenizer(config.model)
        speculative = config.speculative_config
        self.async_scheduling = config.async_scheduling if config.async_scheduling is not None else (
            self.spec.device == "cuda" and speculative is None)
        self.primary_eos = getattr(self.tokenizer, "eos_token_id", None)  # (None without a tokenizer)
        if self.primary_eos is None:
            eos = self.model_config.eos_token_id
            self.primary_eos = eos if isinstance(eos, int) else (eos or [None])[0]
        self.vocab_size = self.model_config.vocab_size
        self.runner = (TPExecutor(self.spec, self.model_config, config.tensor_parallel_size)
                       if config.tensor_parallel_size > 1 else ModelRunner(self.spec, self.model_config,
                                                                           draft_reserve_of(speculative, self.spec)))
        self._check_cache_fits_one_request(self.runner.num_kvcache_blocks)
        self.block_manager = BlockManager(
            self.runner.num_kvcache_blocks, config.kvcache_block_size, config.enable_prefix_caching
        )
        self.scheduler = (OverlapScheduler if self.async_scheduling else Scheduler)(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, self.spec.max_model_len,
            eos_token_ids(config.model, self.model_config),
            num_lookahead_tokens=speculative.num_speculative_tokens if speculative else 0,
        )
        self.proposer = make_proposer(speculative, self) if speculative else None
        self.spec_stats = SpecDecodingStats() if speculative else None
        self._rng = random.Random(config.seed)
        self.requests: dict[str, Sequence] = {}
        self._outputs = OutputProcessor(self._finalize)
        self._first_unfinished: dict[str, int] = {}  # request id -> index of its first unfinished sample (n > 1)
        self._ids = itertools.count()  # of requests added without an id
        self.overlap = Overlap(self) if self.async_scheduling else None  # the overlapped loop (async scheduling)
        self._stepping: list[SchedulerOutput] = []  # what the current step scheduled: failed together if it raises

    def _check_cache_fits_one_request(self, num_blocks: int) -> None:
        bs, max_len = self.config.kvcache_block_size, self.spec.max_model_len
        need = -(-max_len // bs)
        if need > num_blocks:
            self.shutdown()
            raise ValueError(
                f"the KV cache has {num_blocks} blocks of {bs} tokens ({num_blocks * bs} tokens), but one request "
                f"of max_model_len={max_len} tokens needs {need} blocks: raise num_kvcache_blocks (or "
                f"kv_cache_memory_gb / gpu_memory_utilization) or lower max_model_len"
            )

    # ---- requests -------------------------------------------------------------------------------
    def validate_request(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """The prompt's token ids; raises ValueError/TypeError for anything the engine cannot serve. The one check of
        a request: `add_validated` takes what it returns (callers that check a batch before adding any)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        params.check_model_limits(self.vocab_size, self.tokenizer is not None)  # (ranges: SamplingParams itself)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompt given but the checkpoint has no tokenizer files; pass token ids")
            token_ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                raise TypeError("a token-id prompt must be a list of ints")
            token_ids = list(prompt)
        else:
            raise TypeError(f"a prompt must be a str or a list of token ids, got {type(prompt).__name__}")
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        self.scheduler.check_fits(len(token_ids), params.max_tokens)
        return token_ids

    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None) -> str:
        """Validate and add a request; returns its id."""
        return self.add_validated(self.validate_request(prompt, params), params, request_id)

    def add_validated(self, token_ids: list[int], params: SamplingParams, request_id: str | None = None) -> str:
        """Add a request whose prompt `validate_request` returned (n > 1: n sequences; the others wait for the first
        one's prefill and take its prompt blocks from the prefix cache). Sample i draws with seed `seed + i`
        (mod 2^64), so a seeded sample is reproduced alone by a request with n = 1 and that seed."""
        request_id = str(next(self._ids)) if request_id is None else request_id
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        base = params.seed if params.seed is not None else self._rng.getrandbits(63)
        seqs = []
        for i in range(params.n):
            seed = (base + i + 2**63) % 2**64 - 2**63  # 64-bit seeds (signed or not) as the sampler's int64
            seq = Sequence(request_id, token_ids, params, seed)
            if self.tokenizer is not None:  # every request's text, through one detokenizer per sample
                seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params)
            seq.prefill_after = seqs[0] if seqs else None
            seq.group = seqs if params.n > 1 else None  # (this loop fills the list)
            seqs.append(seq)
            self.scheduler.add(seq)
        self.requests[request_id] = seqs[0]
        self._outputs.add(seqs)
        return request_id

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """End a request (all its samples, finish_reason "abort"); returns its final output (shaped by its output
        kind), or None if the engine does not hold it (unknown, or already finished)."""
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        for s in seq.group or [seq]:
            self.scheduler.finish(s, "abort")
        self._drop_ahead_if_done()
        return self._pop_output(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        """The load now: running and waiting sequences, the KV cache's used fraction (blocks neither free nor only
        kept for the prefix cache, as vLLM counts it) and the preemptions so far."""
        sched, blocks = self.scheduler, self.block_manager
        spec = self.spec_stats and dataclasses.replace(
            self.spec_stats, accepted_per_position=list(self.spec_stats.accepted_per_position))
        return EngineStats(len(sched.running), len(sched.waiting), 1.0 - blocks.num_free_blocks / blocks.num_blocks,
                           sched.num_preemptions, spec)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no request holds (later requests find no cached prefix)."""
        self.block_manager.reset_prefix_cache()

    def add_observer(self, observer: ScheduleObserver) -> None:
        """Call `observer.on_schedule(decision)` after every scheduling decision (observers.ScheduleDecision)."""
        self.scheduler.observers.append(observer)

    def remove_observer(self, observer: ScheduleObserver) -> None:
        self.scheduler.observers.remove(observer)

    # ---- the loop -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns an output for every request that advanced in it (new tokens, new text,
        or finished: `finished`), shaped by its `SamplingParams.output_kind` (output_processor.py): those still
        running first, then those that finished. An exception inside the step finishes the requests it had
        scheduled with finish_reason "error" (and the exception's message); the engine goes on serving the
        others."""
        if self.runner is None:
            raise RuntimeError("the engine was shut down")
        self._stepping.clear()
        try:
            finished = self._step()
        except Exception as e:
            seqs = dict.fromkeys(seq for out in self._stepping for seq, _ in out.scheduled)
            # WorkersFailed: the engine itself is gone, no request can be served any more; nothing scheduled: a
            # scheduler bug, not one request's
            if isinstance(e, WorkersFailed) or not seqs:
                raise
            logging.getLogger(__name__).exception("engine step failed; failing its %d requests", len(seqs))
            if self.overlap is not None:
                self.overlap.reset()
            for seq in seqs:
                if not seq.is_finished:  # (those already finished keep their outcome; popped ones stay popped)
                    seq.error = f"the engine step failed: {type(e).__name__}: {e}"
                    self.scheduler.finish(seq, "error")
            finished = [out for out in map(self._pop_output, seqs) if out is not None]  # (None: n > 1 partial)
        return self._progress() + finished

    def _progress(self) -> list[RequestOutput]:
        """The outputs of the step's requests that go on (none to build while every request is FINAL_ONLY)."""
        if not self._outputs.num_streaming:
            return []
        live = {}
        for out in self._stepping:
            for seq, _ in out.scheduled:
                lead = self.requests.get(seq.request_id)
                if lead is not None:
                    live[seq.request_id] = lead.group or [lead]
        return self._outputs.progress(live.values())

    def _step(self) -> list[RequestOutput]:
        """Schedule, run the model, apply its tokens (the overlapped loop instead under async scheduling)."""
        if self.overlap is not None:
            return self.overlap.step()
        out = self._schedule()
        if not out.scheduled:
            return []
        draft_probs = self.proposer.propose(out) if self.proposer else None  # (speculative decoding: drafts)
        launched = self.runner.launch(prepare_step(out, self.config.kvcache_block_size), draft_probs=draft_probs)
        return self._apply(out, self.runner.collect(launched))

    def _schedule(self) -> SchedulerOutput:
        """The next step's schedule, failed together with the step if the step raises (`_stepping`)."""
        out = self.scheduler.schedule()
        if not out.scheduled and self.scheduler.has_unfinished():
            raise RuntimeError("scheduler made no progress with requests pending (engine bug)")
        self._stepping.append(out)
        return out

    def _drop_ahead_if_done(self) -> None:  # (after an abort: overlap.py)
        if self.overlap is not None:
            self.overlap.drop_ahead_if_done()

    def _apply(self, out: SchedulerOutput, result: StepOutput) -> list[RequestOutput]:
        """A step's results into its sequences (errors, logprobs, then Scheduler.update and stop strings); returns the
        outputs of the requests that finished."""
        done, by_id = [], {seq.seq_id: seq for seq, _ in out.scheduled}
        for seq_id, message in result.errors.items():
            seq = by_id[seq_id]
            if seq.is_finished:  # finished while a step behind it was in flight
                continue
            seq.error = message
            self.scheduler.finish(seq, "error")
            done.append(seq)
        for seq_id, dicts in result.prompt_logprobs.items():
            by_id[seq_id].prompt_logprobs.extend(dicts)
        for seq_id, entries in result.logprobs.items():  # (never a step launched ahead: those have no logprobs)
            by_id[seq_id].logprobs.extend(entries)
        if self.proposer is not None:
            self.spec_stats.count(out, result.accepted)
        done += self.scheduler.update(out, result.sampled, result.accepted)
        done += self._check_stop_strings([seq for seq, _ in out.scheduled if seq.params.stop])
        return [o for o in map(self._pop_output, done) if o is not None]

    def _check_stop_strings(self, seqs: list[Sequence]) -> list[Sequence]:
        """Feed the new tokens of `seqs` (the step's requests with stop strings) to their detokenizers; finish those
        that stopped."""
        stopped = []
        for seq in seqs:
            found = feed(seq)
            if found is None:
                continue
            if not seq.is_finished:
                self.scheduler.finish(seq, "stop")
                stopped.append(seq)
            seq.finish_reason, seq.stop_reason = "stop", found  # also over "length" at the last token, as vLLM
        return stopped

    def _pop_output(self, seq: Sequence) -> RequestOutput | None:
        """The request's final output once all its samples have finished (None before, and after it was popped)."""
        group = seq.group or [seq]
        if self.requests.get(seq.request_id) is not group[0]:
            return None
        i = self._first_unfinished.get(seq.request_id, 0)  # a scan resumed where it stopped: O(n) per request
        while i < len(group) and group[i].is_finished:
            i += 1
        if i < len(group):
            self._first_unfinished[seq.request_id] = i
            return None
        self._first_unfinished.pop(seq.request_id, None)
        del self.requests[seq.request_id]
        return self._outputs.final(group)

    def _finalize(self, s: Sequence) -> None:
        """Settle a finished sample before its text is read: feed it (before a stop token becomes the stop_reason:
        its text is left out), then report the stop token id that ended it."""
        tokens = s.output_token_ids
        feed(s)
        if s.stop_reason is None and s.finish_reason == "stop" and tokens and self._is_stop_token_id(s, tokens[-1]):
            s.stop_reason = tokens[-1]

    def _is_stop_token_id(self, seq: Sequence, token: int) -> bool:
        """Whether ending on `token` reports it as the stop reason: a stop token id, or an EOS id other than the
        tokenizer's (vLLM adds generation_config's other EOS ids to stop_token_ids); its own EOS reports None."""
        return token in seq.params.stop_token_ids if seq.params.ignore_eos else token != self.primary_eos

    def shutdown(self) -> None:
        """Stop workers and free device memory; the engine serves nothing afterwards."""
        self.overlap = None
        if self.proposer is not None:
            self.proposer.shutdown()
            self.proposer = None
        if self.runner is not None:
            self.runner.shutdown()
            self.runner = None
