"""Runs the model for one step on one rank: tensors from a StepInput, forward, logits, sampling.

Owns the model, the paged KV cache (one tensor `(num_layers, 2, num_blocks, block_size, kv_heads,
head_dim)`) and the attention backend. Rank 0 samples; other ranks only run the forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import not_
from typing import Any

import numpy as np
import torch

from ..attention import BACKENDS, forward_context
from ..config import ModelConfig, RunnerSpec
from ..distributed import all_reduce_min, broadcast_from_first_rank, rank_kv_heads, tp_rank, tp_size
from ..kernels.kv_quant import kv_scales_from_checkpoint
from ..layers.attention import Attention
from ..layers.logits_processing import PenaltyCounts, logprob_scores, sample_processed
from ..layers.sampler import SamplingBatch, sample, top_logprobs
from ..loader import column_major_linears, init_dummy_weights, load_weights
from ..models import get_model_class
from .cuda_graph import DecodeGraphs
from .inputs import StepInput, dummy_prefill_step
from .staging import stage_step, upload
from .verify import gather_logprobs, resample_rejected, take_verified


@dataclass
class StepOutput:
    sampled: dict[int, int] = field(default_factory=dict)  # seq_id -> token
    accepted: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> its accepted drafts (before its token)
    logprobs: dict[int, list[dict[int, float]]] = field(default_factory=dict)  # seq_id -> one entry per new token
    prompt_logprobs: dict[int, list[dict[int, float]]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)  # seq_id -> why it cannot go on


@dataclass
class Launched:
    """A step queued on the device and not yet waited for (ModelRunner.launch)."""

    step: StepInput
    tokens: torch.Tensor  # (n,) int64 on the device: the sampled tokens, which a step behind it gathers (overlap.py)
    host: torch.Tensor | None  # (2, n) int64 on the host (pinned): tokens and finite flags, once `done` (rank 0)
    done: torch.cuda.Event | None  # None on the CPU, where the step ran synchronously, and on TP ranks other than 0
    # what its logprobs are read from (rank 0, steps that ask for them): the logits, the sampling rows' logits and
    # the processing path's (row indices, scores)
    kept: tuple[torch.Tensor, torch.Tensor | None, Any] | None = None


class ModelRunner:
    def __init__(self, spec: RunnerSpec, model_config: ModelConfig, reserve: tuple[int, int] = (0, 0)) -> None:
        """`reserve`: (bytes per KV block, bytes) that a CUDA cache sized from the memory budget leaves to a draft
        model's cache and weights (draft_model.py `draft_reserve`)."""
        self.spec, self.model_config, self.block_size = spec, model_config, spec.config.kvcache_block_size
        self.reserve = reserve
        self.device = torch.device(spec.device)
        if self.device.type == "cpu":
            torch.set_num_threads(spec.cpu_threads)
        plan = spec.plan  # what every module is built for (config.Plan)
        backend_cls = BACKENDS[plan.backend]
        backend_cls.check_supported(spec.device, self.block_size, model_config.head_dim)
        if plan.kv_fp8 and not backend_cls.fp8_kv:
            raise ValueError(f"kv_cache_dtype fp8 is not supported by attention_backend {spec.backend!r}; use triton")
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(spec.dtype)
        try:
            with torch.device(self.device):
                self.model = get_model_class(model_config)(model_config, plan)
        finally:
            torch.set_default_dtype(default_dtype)
        if spec.config.load_format == "dummy":
            init_dummy_weights(self.model, seed=0)
        else:
            load_weights(self.model, spec.config.model)
        if plan.cpu_weight_layout:
            column_major_linears(self.model)
        self.graphs: DecodeGraphs | None = None
        self.penalty_counts = PenaltyCounts()  # penalized sequences' token counts, kept on the device
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, Attention)]
        self.use_kernels = plan.use_kernels  # the sampler's draw: the Triton kernel on CUDA
        self.kv_dtype = plan.kv_dtype
        if plan.kv_fp8:
            self._set_kv_scales()
        if self.device.type == "cuda":
            self._warmup(measure=spec.config.num_kvcache_blocks is None)
        self.num_kvcache_blocks = self._allocate_kv_cache()
        if plan.cuda_graphs:
            self.graphs = DecodeGraphs(
                self.model, model_config.hidden_size, spec.dtype, self.device, spec.config.max_num_seqs,
                spec.max_model_len, self.block_size,
            )

    def _block_bytes(self) -> int:
        first = self.attn_layers[0].backend
        per_token = 2 * first.num_kv_heads * first.head_dim * self.kv_dtype.itemsize
        return per_token * self.block_size * len(self.attn_layers)

    def _allocate_kv_cache(self) -> int:
        spec = self.spec
        if spec.config.num_kvcache_blocks is not None:
            num_blocks = spec.config.num_kvcache_blocks
        elif self.device.type == "cuda":
            num_blocks = self._blocks_from_gpu_memory()
        else:
            num_blocks = int(spec.config.kv_cache_memory_gb * 2**30) // self._block_bytes()
            useful = spec.config.max_num_seqs * -(-spec.max_model_len // self.block_size)
            num_blocks = min(num_blocks, useful)  # more than every sequence at full length is never used
        num_blocks = all_reduce_min(num_blocks, self.device)
        if num_blocks < 1:
            raise ValueError("the KV cache budget leaves no room for a single block")
        self._set_kv_cache(num_blocks)
        return num_blocks

    def _set_kv_cache(self, num_blocks: int | None) -> None:
        """Allocate the cache and hand each layer its slice; None releases it."""
        first = self.attn_layers[0].backend if self.attn_layers else None
        self.kv_cache = None if num_blocks is None else torch.empty(
            len(self.attn_layers), 2, num_blocks, self.block_size, first.num_kv_heads, first.head_dim,
            dtype=self.kv_dtype, device=self.device,
        )
        for i, layer in enumerate(self.attn_layers):
            layer.kv_cache = None if num_blocks is None else self.kv_cache[i]

    def _set_kv_scales(self) -> None:
        """Each layer's (2, kv_heads) fp8 scales, this rank's heads of the checkpoint's (kernels/kv_quant.py)."""
        total = self.model_config.num_key_value_heads
        scales = kv_scales_from_checkpoint(self.spec.config.model, len(self.attn_layers), total)
        heads = rank_kv_heads(self.model_config.num_attention_heads, total, tp_rank(), tp_size())
        self.kv_scales = scales[:, :, heads].to(self.device)  # (num_layers, 2, local kv_heads)
        for i, layer in enumerate(self.attn_layers):
            layer.backend.kv_scales = self.kv_scales[i]

    def _blocks_from_gpu_memory(self) -> int:
        """The memory beside the peak of the weights and a full-budget forward (`_warmup`), in blocks."""
        free, total = torch.cuda.mem_get_info()
        peak = torch.cuda.max_memory_allocated()
        # vLLM's meaning: this engine's share of the GPU, whatever other processes hold (engines side by side, as
        # the conformance runs start them, each get theirs) ...
        share = total * self.spec.config.gpu_memory_utilization - peak
        # ... but never more than is there: free memory plus what this process's allocator holds unused
        there = free + torch.cuda.memory_reserved() - peak
        per_block, fixed = self.reserve
        return int(min(share, there) - fixed) // (self._block_bytes() + per_block)

    @torch.inference_mode()
    def _warmup(self, measure: bool) -> None:
        """Compile the Triton kernel variants a run meets (long and short prefill tiles, the sampler) before the first
        requests come; `measure`: the first is a full-budget prefill, whose peak memory sizes the cache
        (`_blocks_from_gpu_memory`). Over a temporary cache that nothing is written to (slots are -1)."""
        cfg = self.spec.config
        num_seqs = min(cfg.max_num_seqs, cfg.max_num_batched_tokens)
        per_seq = min(cfg.max_num_batched_tokens // num_seqs, self.spec.max_model_len)
        torch.cuda.reset_peak_memory_stats()
        self._set_kv_cache(num_seqs * -(-per_seq // self.block_size) if measure else 1)  # (the peak counts it)
        if measure:
            self.model.compute_logits(self.compute_hidden(dummy_prefill_step(num_seqs, per_seq, self.block_size)))
        for q_len, num_seqs in ((32, 1), (2, 2)):
            step = dummy_prefill_step(num_seqs, q_len, self.block_size)
            step.logits_indices = list(range(len(step.input_ids)))  # the sampler at 32 and 4 rows
            logits = self.model.compute_logits(self.compute_hidden(step))
            if logits is not None:
                ones = torch.ones(len(logits), device=self.device)
                zeros = torch.zeros(len(logits), dtype=torch.int64, device=self.device)
                for top_k in (0, 1):  # the top-k / top-p path samples float32 logits: a variant of its own
                    sample(logits, SamplingBatch(ones, zeros + top_k, ones, zeros, zeros, needs_filter=top_k > 0),
                           self.use_kernels)
        torch.cuda.synchronize()
        self._set_kv_cache(None)
        torch.cuda.empty_cache()

    def shutdown(self) -> None:
        """Release the model, the KV cache and the graphs (the GPU memory is free for a next engine)."""
        self._set_kv_cache(None)
        self.graphs = self.model = None
        self.attn_layers = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def compute_hidden(self, step: StepInput, prev: Launched | None = None, rows: np.ndarray | None = None,
                       ) -> torch.Tensor:
        """The forward; returns the hidden states of the logits rows (step.logits_indices), (num_logits, hidden).
        With `prev`, the step still in flight (async scheduling), token row r's input id is entry `rows[r]` of the
        host's ids followed by `prev`'s sampled tokens, gathered on the device (overlap.py builds `rows`)."""
        input_ids, positions, meta, logits_rows, rows = stage_step(step, self.device, self.spec.max_model_len, rows)
        if prev is not None:  # (clamped: a NaN row's token must stay a valid id)
            source = torch.cat([input_ids, prev.tokens]) if len(step.input_ids) else prev.tokens  # (decodes only)
            input_ids = source.clamp(0, self.model_config.vocab_size - 1)[rows]
        if self.graphs is not None and self.graphs.can_run(step):
            hidden = self.graphs.run(input_ids, positions, meta)
        else:
            with forward_context(meta):
                hidden = self.model(input_ids, positions)  # (num_tokens, hidden)
        return hidden if step.logits_rows_are_all_rows() else hidden[logits_rows]

    @torch.inference_mode()
    def launch(self, step: StepInput, prev: Launched | None = None, rows: np.ndarray | None = None,
               draft_probs: torch.Tensor | None = None) -> Launched:
        """Queue a step without waiting for it: forward, logits, sampling, and an asynchronous copy of the tokens to
        the host (`collect` waits for them). With `prev` and `rows` (async scheduling, as in vLLM and SGLang: see
        `compute_hidden`), rows continuing from `prev` take its sampled tokens as input ids on the device.
        `draft_probs` (B, K, V): the distributions a draft model drew `step.drafts` from (verify.py)."""
        logits = self.model.compute_logits(self.compute_hidden(step, prev, rows))  # (num_logits, vocab), rank 0 only
        n = len(step.sample_seq_ids)  # 0: prefill chunks only, nothing samples
        # (2, n): tokens, finite flags; logits None: a TP rank other than 0, which takes rank 0's tokens
        if logits is not None and n:
            sample_logits, packed, processed = self._sample_on_device(step, logits, draft_probs)
        else:
            sample_logits = processed = None
            packed = torch.empty(2, n, dtype=torch.int64, device=self.device)
        tokens = broadcast_from_first_rank(packed[0]) if n else packed[0]  # every rank's next input ids
        if logits is None:  # a TP rank other than 0: nothing to collect
            return Launched(step, tokens, None, None)
        wants_logprobs = step.prompt_logprobs or max(step.num_logprobs, default=-1) >= 0
        kept = (logits, sample_logits, processed) if wants_logprobs else None
        host = packed.to("cpu", non_blocking=True)  # (from CUDA: into pinned memory, so asynchronous)
        done = torch.cuda.current_stream().record_event() if self.device.type == "cuda" else None
        return Launched(step, tokens, host, done, kept)

    @torch.inference_mode()
    def collect(self, launched: Launched) -> StepOutput:
        """Wait for a launched step; its tokens, and the logprobs and prompt logprobs it asked for."""
        if launched.done is not None:
            launched.done.synchronize()
        out, step = StepOutput(), launched.step
        logits, sample_logits, processed = launched.kept or (None, None, None)
        for seq_id, rows, targets, k in step.prompt_logprobs:
            targets = torch.tensor(targets, device=logits.device)
            out.prompt_logprobs[seq_id] = _logprob_dicts(logits[rows], targets, [k] * len(targets))
        tokens_list, finite_list = launched.host.tolist()
        out.sampled = dict(zip(step.sample_seq_ids, tokens_list))
        if max(step.num_logprobs, default=-1) >= 0:
            scores = logprob_scores(sample_logits, step.processed, processed)  # per row's logprobs_mode
            entries = _logprob_dicts(sample_logits, launched.tokens, step.num_logprobs, scores)
            out.logprobs = {s: [e] for s, e, k in zip(step.sample_seq_ids, entries, step.num_logprobs) if k >= 0}
            if step.drafts:
                gather_logprobs(out, step, entries)
        if step.drafts:
            take_verified(out, step, tokens_list, finite_list)
        if not all(finite_list):  # (rare: the common case has no loop over the rows but `all`'s)
            for seq_id in compress(step.sample_seq_ids, map(not_, finite_list)):
                out.errors[seq_id] = "the model produced non-finite logits (NaN or inf)"  # no token, no logprobs
                del out.sampled[seq_id]
                out.logprobs.pop(seq_id, None)
        return out

    def _sample_on_device(self, step: StepInput, logits: torch.Tensor, draft_probs: torch.Tensor | None = None,
                          ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """(the sampling rows' logits, (2, n) int64: sampled tokens and 1 where the row's logits are all finite,
        (row indices, processed scores) of the rows that took the processing path, or None)."""
        # one host-to-device copy for all per-request parameters
        i64, f32 = torch.int64, torch.float32
        rows, top_k, seeds, counters, temperature, top_p = upload(
            [(step.sample_rows, i64), (step.top_k, i64), (step.seeds, i64), (step.counters, i64),
             (step.temperature, f32), (step.top_p, f32)], self.device)
        sample_logits = logits if step.sample_rows_are_all_rows() else logits[rows]
        batch = SamplingBatch(
            temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds, counters=counters,
            needs_filter=any(k > 0 for k in step.top_k) or any(p < 1.0 for p in step.top_p),
        )
        if len(step.processed) < len(step.sample_seq_ids):
            packed = sample(sample_logits, batch, self.use_kernels)
        else:  # every row takes the processing path: only the finite flags are needed from here
            packed = torch.isfinite(sample_logits).all(dim=-1).long().expand(2, -1).clone()
        processed = (sample_processed(sample_logits, batch, step.processed, packed, self.penalty_counts)
                     if step.processed else None)
        if draft_probs is not None:  # sampled rows verifying a draft model's tokens: the rejection rule
            resample_rejected(packed, step, sample_logits, batch, processed, draft_probs, self.use_kernels)
        return sample_logits, packed, processed


def _logprob_dicts(logits: torch.Tensor, targets: torch.Tensor, ks: list[int], scores: torch.Tensor | None = None,
                   ) -> list[dict[int, float]]:
    """Per row: its top-k logprobs (k = ks[row]; the row of a k < 0 is not to be read) and its target's."""
    chosen_lp, ids, values = (x.tolist() for x in top_logprobs(logits, targets, max(ks), scores))
    return [dict(zip(ids[i][:k], values[i][:k])) | {target: chosen_lp[i]}
            for i, (target, k) in enumerate(zip(targets.tolist(), ks))]
