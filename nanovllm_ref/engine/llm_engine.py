"""The engine loop: validate and add requests, then schedule -> run the model -> update, step by step.

Async scheduling (`Config.async_scheduling`, steps without logprobs, also under TP): in a steady decode the next step is
scheduled and launched before the current one's tokens are read back (`_step_async`), so the host's update,
scheduling and input preparation overlap the GPU instead of idling it between steps (vLLM's async scheduling,
SGLang's overlap scheduler).

Bad input raises before any state changes; a failing request (non-finite logits) is finished with an
error while the others go on; a request that can never fit is refused when added.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import torch

from ..config import Config
from ..models import check_sliding_window
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from .block_manager import BlockManager
from .inputs import StepInput, prepare_step
from .model_runner import Launched, ModelRunner, RunnerSpec, StepOutput
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_config(path: str) -> Any:
    from transformers import AutoConfig

    if not os.path.isdir(path):
        raise ValueError(f"model path {path!r} does not exist or is not a folder")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model folder {path!r} has no config.json")
    return AutoConfig.from_pretrained(path, trust_remote_code=False)


def load_tokenizer(path: str) -> Any | None:
    """The checkpoint's tokenizer, or None if it ships none (token-id prompts still work)."""
    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
    if not any(os.path.isfile(os.path.join(path, n)) for n in names):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


def eos_token_ids(path: str, hf_config: Any) -> frozenset[int]:
    ids: set[int] = set()
    sources = [getattr(hf_config, "eos_token_id", None)]
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            sources.append(json.load(f).get("eos_token_id"))
    for src in sources:
        ids.update([src] if isinstance(src, int) else (src or []))
    return frozenset(ids)


def resolve_spec(config: Config, hf_config: Any) -> RunnerSpec:
    from ..attention import resolve_backend_name

    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA GPU")
    if config.dtype != "auto":
        dtype = _DTYPES[config.dtype]
    elif device == "cpu":
        dtype = torch.float32
    else:
        ckpt = getattr(hf_config, "torch_dtype", None) or getattr(hf_config, "dtype", None)
        dtype = ckpt if ckpt in (torch.bfloat16, torch.float16) else torch.bfloat16
    max_pos = hf_config.max_position_embeddings
    max_model_len = config.max_model_len or max_pos
    if max_model_len > max_pos:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's max_position_embeddings={max_pos}")
    check_sliding_window(hf_config, max_model_len)
    return RunnerSpec(
        model_path=config.model, device=device, dtype=dtype,
        backend=resolve_backend_name(config.attention_backend, device, config.kvcache_block_size),
        block_size=config.kvcache_block_size,
        max_model_len=max_model_len, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, num_kvcache_blocks=config.num_kvcache_blocks,
        kv_cache_memory_gb=config.kv_cache_memory_gb, gpu_memory_utilization=config.gpu_memory_utilization,
        enforce_eager=config.enforce_eager, load_format=config.load_format,
    )


class LLMEngine:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.hf_config = load_hf_config(config.model)
        self.spec = resolve_spec(config, self.hf_config)
        self.tokenizer = load_tokenizer(config.model)
        self.vocab_size = self.hf_config.vocab_size
        if config.tensor_parallel_size > 1:
            from .workers import TPExecutor

            self.runner = TPExecutor(self.spec, self.hf_config, config.tensor_parallel_size)
        else:
            self.runner = ModelRunner(self.spec, self.hf_config)
        self._check_cache_fits_one_request(self.runner.num_kvcache_blocks)
        self.block_manager = BlockManager(
            self.runner.num_kvcache_blocks, config.kvcache_block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, self.spec.max_model_len,
            eos_token_ids(config.model, self.hf_config),
        )
        self._rng = random.Random(config.seed)
        self.requests: dict[str, Sequence] = {}
        self._by_seq_id: dict[int, Sequence] = {}
        self._next_id = 0
        self._ahead: tuple[SchedulerOutput, Launched] | None = None  # a decode step in flight (async scheduling)

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
        """The prompt's token ids; raises ValueError/TypeError for anything the engine cannot serve."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
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

    def add_request(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> str:
        token_ids = self.validate_request(prompt, params)
        if request_id is None:
            request_id = str(self._next_id)
            self._next_id += 1
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        seq = Sequence(request_id, token_ids, params, seed)
        self.scheduler.add(seq)
        self.requests[request_id] = seq
        self._by_seq_id[seq.seq_id] = seq
        return request_id

    def abort_request(self, request_id: str) -> RequestOutput | None:
        seq = self.requests.get(request_id)
        if seq is None or seq.is_finished:
            return None
        self.scheduler.finish(seq, "abort")
        self._drop_ahead_if_done()
        return self._pop_output(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the loop -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns the requests that finished in it."""
        if self.runner is None:
            raise RuntimeError("the engine was shut down")
        if self._ahead is not None:  # the step launched ahead in the previous call
            (out, launched), self._ahead = self._ahead, None
            return self._step_async(out, launched)
        out = self.scheduler.schedule()
        if not out.scheduled:
            if self.scheduler.has_unfinished():
                raise RuntimeError("scheduler made no progress with requests pending (engine bug)")
            return []
        step = prepare_step(out, self.config.kvcache_block_size)
        if not self._can_launch_ahead(out, step):
            return self._apply(out, self.runner.execute(step))
        return self._step_async(out, self.runner.launch_decode(step))

    def _can_launch_ahead(self, out: SchedulerOutput, step: StepInput) -> bool:
        return self.config.async_scheduling and out.decode_batch is not None and max(step.num_logprobs) < 0

    def _step_async(self, out: SchedulerOutput, launched: Launched) -> list[RequestOutput]:
        """With `out` in flight, schedule and launch the next decode step (its input ids are `out`'s tokens,
        on the device), then wait for `out` and apply it. Rows that finish in `out` compute one more token in the
        step behind it, which is dropped (as in vLLM's async scheduling)."""
        ahead = self.scheduler.schedule_ahead()
        if ahead is not None:
            keep = None
            if len(ahead.scheduled) != len(out.scheduled):  # rows of `out` finished before `ahead` was scheduled
                keep = [i for i, (seq, _) in enumerate(out.scheduled) if not seq.is_finished]
            step = prepare_step(ahead, self.config.kvcache_block_size)
            self._ahead = (ahead, self.runner.launch_decode(step, prev=launched, rows=keep))
        finished = self._apply(out, self.runner.collect(launched))
        self._drop_ahead_if_done()
        return finished

    def _drop_ahead_if_done(self) -> None:
        """Forget the step launched ahead once every row of it has finished: nothing of it is to be applied."""
        if self._ahead is not None and all(seq.is_finished for seq, _ in self._ahead[0].scheduled):
            self.runner.collect(self._ahead[1])
            self._ahead = None

    def _apply(self, out: SchedulerOutput, result: StepOutput) -> list[RequestOutput]:
        done = []
        for seq_id, message in result.errors.items():
            seq = self._by_seq_id.get(seq_id)
            if seq is None or seq.is_finished:  # finished while a step behind it was in flight
                continue
            seq.error = message
            self.scheduler.finish(seq, "error")
            done.append(seq)
        for seq_id, dicts in result.prompt_logprobs.items():
            self._by_seq_id[seq_id].prompt_logprobs.extend(dicts)
        for seq_id, entry in result.logprobs.items():  # (never a step launched ahead: those have no logprobs)
            self._by_seq_id[seq_id].logprobs.append(entry)
        done += self.scheduler.update(out, result.sampled, result.tokens)
        return [self._pop_output(seq) for seq in done]

    def _pop_output(self, seq: Sequence) -> RequestOutput:
        del self.requests[seq.request_id]
        del self._by_seq_id[seq.seq_id]
        tokens = seq.output_token_ids
        text = self.tokenizer.decode(tokens, skip_special_tokens=True) if self.tokenizer is not None else ""
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            token_ids=tokens, text=text, finish_reason=seq.finish_reason, logprobs=seq.logprobs,
            prompt_logprobs=seq.prompt_logprobs, num_cached_tokens=seq.num_cached_tokens, error=seq.error,
        )

    def shutdown(self) -> None:
        """Stop workers and free device memory; the engine serves nothing afterwards."""
        self._ahead = None
        if self.runner is not None:
            self.runner.shutdown()
            self.runner = None
