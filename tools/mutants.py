"""Mutation testing: realistic bugs planted one at a time in a copy of the repo; the tests must catch each.

Each mutant replaces one exact snippet of the source (the snippet must occur exactly once, or the run stops
with an error before anything runs: the list cannot rot silently) in a temporary copy of the tree
(``shutil.copytree``; the working tree is never touched), then runs two sets of tests, each stopping at its
first failure: pytest exit status 1 or 2 (failures or collection errors) means caught, 0 means survived.

* the conformance column (the headline: what another engine's authors get): ``pytest`` on the conformance
  suite alone, CPU, Triton kernels in the interpreter, qwen3-tiny in float32 (``--model qwen3-tiny --dtype
  float32``; a mutant whose site only a checkpoint reaches names it, e.g. the MoE router), restricted per
  mutant to the files that can reach its site (``Mutant.conformance``; default: every conformance file but the
  kernel module, workload first). A subset catching a mutant implies the whole suite catches it. Kernel
  mutants run ``conformance/test_kernels.py -k <kernel>``; those that need a GPU say so (``gpu=True``) and are
  reported as such (``pytest conformance -m gpu``);
* the targeted column: the project's own tests chosen for the mutant (``Mutant.tests``).

The file is restored before the next mutant. A baseline run of every chosen test on the unmutated copy must
pass first. The exact command of a conformance run is printed with ``--list``.

    python -m tools.mutants                 # all; prints a markdown table, exits 1 if any mutant survived
    python -m tools.mutants --only top-k    # some (names or substrings); --list shows them
    python -m tools.mutants --conformance-only   # only the headline column (about half the time)
    python3 -m tools.mutants --gpu --jobs 8      # the GPU column: Triton-kernel mutants, -m gpu (mutants_gpu.py)
    nox -s mutants
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .mutation import (
    CONFORMANCE,
    FP8_KERNEL_CHECK,
    IGNORE,
    ROOT,
    Mutant,
    check_snippets,
    failing_tests,
    pytest_command,
    pytest_env,
)

MOE = ("--model", "qwen3-moe-tiny")  # a mutant option after OPTIONS overrides its --model


def kernels(name: str) -> tuple[str, ...]:
    return ("conformance/test_kernels.py", "-k", name)


GOLDEN = "conformance/test_golden.py::test_golden"
KERNEL_ATTN = "tests/kernels/test_kernel_attention.py::test_prefill_attention"
SDPA_ORACLE = "tests/attention/test_sdpa_backend.py"  # the sdpa backend (the CPU default) against the torch reference
RMS = "tests/kernels/test_kernel_rmsnorm.py::test_rms_norm"
EPILOGUE = "tests/kernels/test_kernel_qkv_epilogue.py"
BLOCKS, SCHED = "tests/engine/properties/test_block_manager_props.py", "tests/engine/properties/test_scheduler_props.py"
SAMPLING = "tests/layers/test_sampler_distributions.py"
SAMPLING_CONF = "conformance/test_sampling.py"  # the sampling conformance cases
ENGINE = "tests/engine/test_greedy_matches_transformers.py"
STEPS_CONF = "conformance/test_sampling_steps.py"  # logprobs modes along trajectories, seeds
CACHE_CONF = "conformance/test_prefix_cache.py"  # cached prompt tokens of a scripted workload
ASYNC = ("--engine-arg", "async_scheduling=true")  # the engine's CUDA default, forced where a site runs only under it
TP_BF16 = ("conformance/test_invariance.py", "-k", "tensor_parallel_bfloat16", "--dtype", "bfloat16")  # over OPTIONS
ENGINE_PY, DETOK = "nanovllm_ref/engine/llm_engine.py", "nanovllm_ref/engine/detokenizer.py"
TEXT_CONF, WORDS = "conformance/test_text.py", ("--model", "qwen3-words-hd32")  # the word-level golden
DETOK_TESTS = "tests/engine/test_detokenizer.py"
FP8_ENGINE, FP8_KERNELS = "tests/engine/test_fp8_kv_cache.py", "tests/kernels/test_kernel_fp8_kv.py"
FP8_TIER = ("conformance/test_fp8_kv.py",)
GLUON_FP8, GLUON_TESTS = "nanovllm_ref/kernels/decode_attention_fp8.py", "tests/kernels/test_decode_attention_fp8.py"
INVARIANT_TESTS = "tests/engine/test_batch_invariant.py"
INVARIANCE_EXACT = ("conformance/test_batch_invariance.py", "--invariance", "exact", "--engine-arg",
                    "batch_invariant=true")
INVARIANCE_CUDA = ("--dtype", "bfloat16", "--engine-arg", "device=cuda", "--engine-arg", "gpu_memory_utilization=0.025")
ROUTER_CONF = ("conformance/test_moe_router.py", *MOE, "--dtype", "bfloat16")  # near-tied router logits, bf16
DIALECT_CONF = "conformance/test_config_dialects.py"  # each golden again in the rope_scaling dialect
DIALECT_VIEW = "tests/oracle/test_dialects.py::test_nanovllm_ref_passes_the_goldens_through_the_legacy_view"
ROUTES, SERVING_CONF = "nanovllm_ref/serve/routes.py", "conformance/test_serving.py"  # OpenAI routes; their check
SERVE_TESTS = "tests/serve/test_openai_client.py"
EDGES_CONF = "conformance/test_sampling_edges.py"  # extreme filters, filters with penalties, min_tokens alone
ABORT_CONF = "conformance/test_abort.py"  # an n > 1 request aborted mid-generation
SEEDS_CONF = "conformance/test_seeds.py"  # seed 0, fresh instances, the engine-level seed
REJECTION = "nanovllm_ref/kernels/rejection.py"  # the speculative-decoding rejection sampler and its kernel
REJECTION_TESTS = "tests/kernels/test_kernel_rejection.py"
# structured outputs: validity, the greedy trajectory against the masked reference, mixed batches, G-tests
STRUCT_CONF = ("conformance/test_structured.py", "conformance/test_structured_sampling.py")
STRUCT_SPM = ("conformance/test_structured.py", "--model", "mistral-spm-hd32")
STRUCT_MANAGER, BITMASK_TESTS = "tests/structured/test_manager.py", "tests/kernels/test_token_bitmask.py"
STRUCT_VOCAB, RUNNER = "tests/structured/test_vocab.py", "nanovllm_ref/engine/model_runner.py"
MANAGER = "nanovllm_ref/structured/manager.py"
SCHED_PY, VERIFY_PY, INPUTS_PY = ("nanovllm_ref/engine/scheduler.py", "nanovllm_ref/engine/verify.py",
                                  "nanovllm_ref/engine/inputs.py")
SPEC_CONF = ("conformance/test_spec_decode.py",)  # speculative decoding: goldens, seeds, stops, prefix cache
SPEC_SAMPLING = ("conformance/test_spec_decode_sampling.py",)  # its sampled distribution (G-tests)
SPEC_TESTS = "tests/engine/test_speculative.py"


# the sampling rows' block of ModelRunner._sample_on_device, and the same reporting logprobs of the unmasked logits
STRUCT_SAMPLE_BLOCK = (
    '        finite = None\n'
    "        if step.bitmask is not None:  # the grammar's mask first, before logprobs and any processing (as vLLM)\n"
    "            finite = torch.isfinite(sample_logits).all(dim=-1)  # the model's logits (the mask writes -inf)\n"
    '            self._apply_bitmask(sample_logits, step)\n'
    '        batch = SamplingBatch(\n'
    '            temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds, counters=counters,\n'
    '            needs_filter=any(k > 0 for k in step.top_k) or any(p < 1.0 for p in step.top_p),\n'
    '        )\n'
    '        if len(step.processed) < len(step.sample_seq_ids):\n'
    '            packed = sample(sample_logits, batch, self.use_kernels)\n'
    '        else:  # every row takes the processing path: only the finite flags are needed from here\n'
    '            packed = torch.isfinite(sample_logits).all(dim=-1).long().expand(2, -1).clone()\n'
    '        processed = (sample_processed(sample_logits, batch, step.processed, packed, self.penalty_counts)\n'
    '                     if step.processed else None)\n'
    '        if draft_probs is not None:  # sampled rows verifying a draft model\'s tokens: the rejection rule\n'
    '            resample_rejected(packed, step, sample_logits, batch, processed, draft_probs, self.use_kernels)\n'
    '        if finite is not None:\n'
    '            packed[1] = finite\n'
    '        return sample_logits, packed, processed\n'
)
STRUCT_SAMPLE_BLOCK_UNMASKED = (
    '        finite = None\n'
    "        if step.bitmask is not None:  # the grammar's mask first, before logprobs and any processing (as vLLM)\n"
    "            finite = torch.isfinite(sample_logits).all(dim=-1)  # the model's logits (the mask writes -inf)\n"
    '            unmasked = sample_logits.clone()\n'
    '            self._apply_bitmask(sample_logits, step)\n'
    '        batch = SamplingBatch(\n'
    '            temperature=temperature, top_k=top_k, top_p=top_p, seeds=seeds, counters=counters,\n'
    '            needs_filter=any(k > 0 for k in step.top_k) or any(p < 1.0 for p in step.top_p),\n'
    '        )\n'
    '        if len(step.processed) < len(step.sample_seq_ids):\n'
    '            packed = sample(sample_logits, batch, self.use_kernels)\n'
    '        else:  # every row takes the processing path: only the finite flags are needed from here\n'
    '            packed = torch.isfinite(sample_logits).all(dim=-1).long().expand(2, -1).clone()\n'
    '        processed = (sample_processed(sample_logits, batch, step.processed, packed, self.penalty_counts)\n'
    '                     if step.processed else None)\n'
    '        if draft_probs is not None:  # sampled rows verifying a draft model\'s tokens: the rejection rule\n'
    '            resample_rejected(packed, step, sample_logits, batch, processed, draft_probs, self.use_kernels)\n'
    '        if finite is not None:\n'
    '            packed[1] = finite\n'
    '        return (unmasked if finite is not None else sample_logits), packed, processed\n'
)

M = Mutant
MUTANTS: tuple[Mutant, ...] = (
    M("rmsnorm-kernel-mean", "nanovllm_ref/kernels/rmsnorm.py", "var = tl.sum(h * h, 0) / hidden",
      "var = tl.sum(h * h, 0) / BLOCK", "Triton RMSNorm averages over the padded block, not the hidden size",
      (RMS,), kernels("rms_norm")),
    M("rotary-kernel-sign", "nanovllm_ref/kernels/qkv_epilogue.py", "b1 = (-x2 * sin)",
      "b1 = (x2 * sin)", "Triton RoPE (QKV epilogue): rotate-half without the minus sign", (EPILOGUE,),
      kernels("qkv_epilogue")),
    M("rotary-kernel-half-mask", "nanovllm_ref/kernels/qkv_epilogue.py", "d_mask = offs_d < HALF",
      "d_mask = offs_d < BLOCK_HALF", "Triton RoPE (QKV epilogue) masks to the padded half, not head_dim // 2 "
      "(head sizes like 80)", (EPILOGUE,), kernels("qkv_epilogue")),
    M("attention-kernel-causal", "nanovllm_ref/kernels/_triton_common.py",
      "visible = offs_n[None, :] < row_end[:, None]", "visible = offs_n[None, :] <= row_end[:, None]",
      "Triton paged attention: the causal mask lets a query see one key too many", (KERNEL_ATTN,),
      kernels("attention")),
    M("store-kv-kernel-slot0", "nanovllm_ref/kernels/store_kv.py", "if slot < 0:  # padding token",
      "if slot <= 0:  # padding token", "Triton KV store skips slot 0 as if it were padding",
      ("tests/kernels/test_kernel_store_kv.py",), kernels("store_kv")),
    M("rmsnorm-eps", "nanovllm_ref/kernels/rmsnorm.py", "h.pow(2).mean(-1, keepdim=True).add_(eps)",
      "h.pow(2).mean(-1, keepdim=True).add_(1e-5)", "RMSNorm reference uses eps 1e-5, not the config's",
      (RMS, GOLDEN)),
    M("rotary-reference-sign", "nanovllm_ref/kernels/rotary.py",
      "torch.cat([-sin, sin], dim=-1)", "torch.cat([sin, -sin], dim=-1)",
      "RoPE reference rotates the wrong way (rotate_half sign)", (GOLDEN,)),
    M("attention-scale", "nanovllm_ref/models/qwen3.py", "scale = self.head_dim**-0.5", "scale = self.head_dim**-1",
      "attention scale 1/d instead of 1/sqrt(d)", (GOLDEN,)),
    M("attention-causal-reference", "nanovllm_ref/kernels/prefill_attention.py",
      "q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)",
      "q_pos = torch.arange(seq_len - q_len + 1, seq_len + 1, device=q.device)",
      "reference attention: query positions off by one (a token sees the next one)", (SDPA_ORACLE,),
      kernels("prefill_attention")),  # the engine's CPU default is sdpa: the reference is the kernels' oracle
    M("sdpa-causal", "nanovllm_ref/attention/sdpa_backend.py",
      ".tril(n - (b - a))", ".tril(n - (b - a) + 1)",
      "sdpa backend (the CPU default): a query after a cached prefix sees the next token", (SDPA_ORACLE,)),
    M("sdpa-fresh-not-causal", "nanovllm_ref/attention/sdpa_backend.py", "is_causal=mask is None,",
      "is_causal=False,", "sdpa backend: a batch of fresh prompts attends without the causal mask",
      (GOLDEN,)),
    M("sdpa-gqa-tiled", "nanovllm_ref/attention/sdpa_backend.py",
      "queries = q.float().reshape(-1, self.num_heads // self.num_kv_heads, self.head_dim)",
      "queries = q.float().reshape(q.shape[0], -1, self.num_kv_heads, self.head_dim).transpose(1, 2)"
      ".reshape(-1, self.num_heads // self.num_kv_heads, self.head_dim)",
      "sdpa backend decode: query heads tiled over the KV heads instead of grouped", (GOLDEN,)),
    M("sdpa-reads-past-context", "nanovllm_ref/kernels/prefill_attention.py",
      "torch.where(key_pos < seq_lens[:, None], slots, slots[:, :1])", "slots",
      "sdpa backend: masked keys past the context read the cache there (a freed block's NaN poisons the sum)",
      (SDPA_ORACLE,), kernels("sdpa")),  # NaN-poisoned unused blocks: the kernel module's paged batches
    M("prefix-hash-unchained", "nanovllm_ref/engine/block_manager.py",
      "parent = seq.block_hashes[-1] if seq.block_hashes else 0", "parent = 0",
      "prefix cache: a full block's hash ignores its parent block", (BLOCKS,)),
    M("refcount-reset", "nanovllm_ref/engine/block_manager.py", "            block.ref_count += 1\n",
      "            block.ref_count = 1\n", "prefix cache hit resets a shared block's ref count instead of adding one",
      (BLOCKS,)),
    M("eviction-mru", "nanovllm_ref/engine/block_manager.py", "self.free_queue.popitem(last=False)",
      "self.free_queue.popitem(last=True)", "eviction hands out the most recently freed block first", (BLOCKS,)),
    M("budget-prefill", "nanovllm_ref/engine/scheduler.py",
      "num_new = min(seq.num_tokens - len(cached) * self.block_manager.block_size, budget)",
      "num_new = seq.num_tokens - len(cached) * self.block_manager.block_size",
      "scheduler: a new prefill is not capped by the remaining token budget", (SCHED,)),
    M("preempt-oldest", "nanovllm_ref/engine/scheduler.py", "victim = self.running.pop()  # the newest",
      "victim = self.running.pop(0)  # the oldest", "scheduler preempts the oldest running sequence", (SCHED,)),
    M("length-limit-one-late", "nanovllm_ref/engine/scheduler.py",
      "len(seq.token_ids) >= seq.max_num_tokens else None", "len(seq.token_ids) > seq.max_num_tokens else None",
      "a request finishes one token past its length limit", (SCHED,)),
    M("slot-block-boundary-previous-block", "nanovllm_ref/engine/inputs.py",
      "table_array[seq_of_token, positions // block_size]",
      "table_array[seq_of_token, np.maximum(positions - 1, 0) // block_size]",
      "a token starting a block is stored into the previous block (its slot from the wrong table entry)", (SCHED,)),
    # blind spots an early table showed: stop / EOS / finish reasons, per-request logprobs, prefix cache with prompt
    # logprobs, scheduler budget and chunks, max_model_len, kernel magnitudes, the MoE router
    M("eos-config-only", "nanovllm_ref/engine/llm_engine.py",
      'sources.append(json.load(f).get("eos_token_id"))', "pass",
      "EOS ids read from config.json only, generation_config.json's ignored", (ENGINE,)),
    M("ignore-eos-inverted", "nanovllm_ref/engine/scheduler.py", "if not seq.params.ignore_eos:",
      "if seq.params.ignore_eos:", "EOS honoured only when ignore_eos is set", (ENGINE, SCHED)),
    M("finish-reason-general", "nanovllm_ref/engine/scheduler.py", '"stop" if token in seq.stop_ids',
      '"length" if token in seq.stop_ids',
      "a request ended by a stop token reports finish_reason 'length'", (ENGINE, SCHED)),
    M("stop-token-ignored", "nanovllm_ref/engine/scheduler.py", '"stop" if token in seq.stop_ids else',
      '"stop" if False else',
      "a request never stops on a stop token (EOS or stop_token_ids)", (ENGINE, SCHED)),
    M("max-model-len-cap", "nanovllm_ref/engine/scheduler.py",
      "seq.max_num_tokens = min(seq.max_num_tokens, self.max_model_len)",
      "seq.max_num_tokens = min(seq.max_num_tokens, self.max_model_len - 1)",
      "a request reaching max_model_len exactly ends one token early", (SCHED, ENGINE)),
    M("max-model-len-refuses-exact", "nanovllm_ref/engine/scheduler.py", "if need > self.max_model_len:",
      "if need >= self.max_model_len:", "prompt + max_tokens == max_model_len is refused",
      ("tests/engine/test_request_errors.py",)),
    M("logprobs-count-shared", "nanovllm_ref/engine/model_runner.py",
      "dict(zip(ids[i][:k], values[i][:k]))", "dict(zip(ids[i], values[i]))",
      "every request of a step gets the largest logprobs count of the step", ("tests/oracle/test_request_adapter.py",)),
    M("logprobs-rescaled", "nanovllm_ref/layers/sampler.py", "logprobs = logits.float().log_softmax(dim=-1)",
      "logprobs = (logits.float() * 1.02).log_softmax(dim=-1)",
      "logprobs of a rescaled distribution (every argmax kept)", (GOLDEN,)),
    M("prompt-logprobs-use-cache", "nanovllm_ref/engine/sequence.py", "return self.params.prompt_logprobs is None",
      "return True", "requests with prompt logprobs read the prefix cache (cached positions get no logprobs)",
      (ENGINE,)),
    M("prompt-logprobs-recompute-dup", "nanovllm_ref/engine/inputs.py",
      "first = max(start, len(seq.prompt_logprobs) - 1)", "first = start",
      "a recompute after preemption reports the prompt logprobs again", (ENGINE,)),
    M("prefix-cache-whole-prompt", "nanovllm_ref/engine/block_manager.py",
      "for i in range((seq.num_tokens - 1) // bs):", "for i in range(seq.num_tokens // bs):",
      "a fully cached prompt leaves no token to compute", (BLOCKS,)),
    M("budget-running-uncapped", "nanovllm_ref/engine/scheduler.py",
      "num_new = min(num_tokens - seq.num_computed_tokens + self._lookahead(seq, num_tokens), budget)",
      "num_new = num_tokens - seq.num_computed_tokens + self._lookahead(seq, num_tokens)",
      "scheduler: a running prefill's next chunk is not capped by the token budget", (SCHED,)),
    M("admit-on-empty-budget", "nanovllm_ref/engine/scheduler.py",
      "while self.waiting and budget > 0 and", "while self.waiting and budget >= 0 and",
      "scheduler admits a request with no token budget left (a 0-token grant)", (SCHED,)),
    M("fcfs-rotate", "nanovllm_ref/engine/scheduler.py",
      "            if not self.block_manager.allocate(seq, num_new, cached):\n                break\n",
      "            if not self.block_manager.allocate(seq, num_new, cached):\n"
      "                self.waiting.rotate(-1)\n                break\n",
      "scheduler sends a request that does not fit to the back of the queue (a younger one goes first)", (SCHED,)),
    M("moe-router-never-normalized", "nanovllm_ref/models/qwen3_moe.py", "        if self.norm_topk_prob:\n",
      "        if False:\n", "MoE router: norm_topk_prob ignored (top-k weights never renormalized)",
      ("tests/models/test_architectures.py",), (*CONFORMANCE, *MOE)),
    M("rmsnorm-kernel-input-dtype", "nanovllm_ref/kernels/rmsnorm.py", "        h = x.to(tl.float32)\n",
      "        h = x\n", "Triton RMSNorm sums the squares in the input dtype (fp16 overflows at large magnitudes)",
      (RMS,), kernels("rms_norm")),
    M("decode-reduce-no-max", "nanovllm_ref/kernels/decode_attention.py", "w = tl.exp2(m - m_max)",
      "w = tl.exp2(m)", "Triton split-decode reduce without the max shift (overflows at large scores)",
      ("tests/kernels/test_kernel_attention.py",), kernels("decode")),
    M("decode-grid-split-as-head", "nanovllm_ref/kernels/decode_attention.py",
      "kvh = (pid // num_splits) % num_kv_heads", "kvh = pid % num_kv_heads",
      "Triton split-decode flat grid: the split index read as the KV head (programs attend the wrong head)",
      ("tests/kernels/test_kernel_attention.py",), kernels("decode")),
    M("online-softmax-max-reset", "nanovllm_ref/kernels/_triton_common.py",
      "m_new = tl.maximum(m_i, tl.max(s_max, 1))", "m_new = tl.max(s_max, 1)",
      "Triton attention: the running max forgets earlier tiles (overflows when scores fall)",
      (KERNEL_ATTN,), kernels("attention")),
    M("async-apply-to-wrong-rows", "nanovllm_ref/engine/scheduler.py",
      "        for seq, _ in out.scheduled:\n            token = sampled.get(seq.seq_id)\n",
      "        for seq, token in zip([q for q, _ in out.scheduled if not q.is_finished], [*sampled.values()]):\n",
      "async scheduling applies a step's tokens by row order: after a row finished in flight, to the wrong rows",
      ("tests/engine/test_async_scheduling.py",)),
    M("flash-attn-not-causal", "nanovllm_ref/attention/flash_attn_backend.py",
      "causal=True, block_table=meta.block_tables", "causal=False, block_table=meta.block_tables",
      "flash-attn backend: prefill without the causal mask", ("tests/attention/test_flash_attn_backend.py",),
      ("conformance/test_golden.py",), gpu=True,
      gpu_args=("--engine-arg", "attention_backend=flash-attn", "--engine-arg", "kvcache_block_size=256")),
    M("config-ignores-rope-scaling", "nanovllm_ref/config.py",
      '"rope_parameters": tuple(sorted(rope_parameters(hf).items())),',
      '"rope_parameters": tuple(sorted(rope_parameters(__import__("types").SimpleNamespace(**{k: v for k, v in '
      '__import__("json").load(open(os.path.join(hf._name_or_path, "config.json"))).items() '
      'if k != "rope_scaling"})).items())),',
      "RoPE settings read from config.json in one dialect: rope_parameters, else the top-level rope_theta alone "
      "(a published checkpoint's rope_scaling, Llama 3's llama3 scaling, ignored)", (DIALECT_VIEW,),
      (DIALECT_CONF, "--model", "llama3-tiny")),
    M("cpu-qk-block-rope-offset", "nanovllm_ref/kernels/qkv_epilogue.py",
      "rotate(x, cos[a : a + rows], sin[a : a + rows], out=out[a : a + rows])",
      "rotate(x, cos[: len(x)], sin[: len(x)], out=out[a : a + rows])",
      "CPU q/k norm + RoPE in cache-sized blocks: every block after the first takes the first block's angles",
      (GOLDEN,)),
    M("graph-pad-slot-zero", "nanovllm_ref/engine/cuda_graph.py",
      "self.slot_mapping[n:bs], self.seq_lens[n:bs] = -1, 0", "self.slot_mapping[n:bs], self.seq_lens[n:bs] = 0, 0",
      "CUDA-graph replay: the padding rows of a bucket store their K/V into slot 0, not nowhere",
      ("tests/kernels/test_kernel_gpu_full.py",), ("conformance/test_golden.py",), gpu=True),
    M("top-k-off-by-one", "nanovllm_ref/layers/sampler.py", "sorted_logits.gather(-1, (vocab - k)[:, None])",
      "sorted_logits.gather(-1, (vocab - k - 1).clamp(min=0)[:, None])",
      "top-k keeps k + 1 tokens", (f"{SAMPLING}::test_top_k_restricts_support_and_renormalizes",), (SAMPLING_CONF,)),
    M("top-p-nucleus", "nanovllm_ref/layers/sampler.py", "drop = probs.cumsum(dim=-1) <= 1 - top_p",
      "drop = probs.cumsum(dim=-1) - probs <= 1 - top_p", "top-p drops the token that crosses p",
      (f"{SAMPLING}::test_top_p_keeps_the_smallest_nucleus",), (SAMPLING_CONF,)),
    M("temperature-multiplies", "nanovllm_ref/kernels/sampling.py",
      "scores = logits / torch.where(temperature > 0", "scores = logits * torch.where(temperature > 0",
      "sampling multiplies the logits by the temperature", (f"{SAMPLING}::test_temperature_distribution",),
      kernels("gumbel")),
    M("seed-position-ignored", "nanovllm_ref/kernels/sampling.py",
      "return pcg_hash((pcg_hash((seeds ^ (seeds >> 32)) & _M32) + counters) & _M32)",
      "return pcg_hash((pcg_hash((seeds ^ (seeds >> 32)) & _M32)) & _M32)",
      "seeded noise ignores the token position (every step draws the same noise)", (SAMPLING,), kernels("gumbel")),
    M("kernel-key-ignores-position", "nanovllm_ref/kernels/sampling.py",
      "+ tl.load(counters_ptr + row).to(tl.uint32))", ")",
      "the Triton sampler's row key ignores the token position",
      (f"{SAMPLING}::test_gumbel_kernel_matches_reference",), kernels("gumbel")),
    M("gumbel-splits-share-a-slot", "nanovllm_ref/kernels/sampling.py",
      "at = row * tl.num_programs(1) + split", "at = row * tl.num_programs(1)",
      "Triton sampler: every vocabulary split writes its partial best to the row's first slot",
      (f"{SAMPLING}::test_gumbel_kernel_matches_reference",), kernels("gumbel")),
    M("kernel-nan-row-unflagged", "nanovllm_ref/kernels/sampling.py",
      "bad = x * 0.0 + bad", "bad = bad", "the Triton sampler does not flag a row of NaN/inf logits",
      (f"{SAMPLING}::test_gumbel_kernel_matches_reference",), kernels("gumbel")),
    M("gumbel-noise-series-term", "nanovllm_ref/kernels/sampling.py", "near = w * (1.0 + w * (0.5 + w",
      "near = w * (1.0 + w * (1.0 + w", "the Triton sampler's -ln(u) series near u = 1 has a wrong w^2 term (noise off "
      "by up to 3% where it is largest)", ("tests/kernels/test_kernel_sampling.py",), kernels("gumbel")),
    # the speculative-decoding rejection sampler: its reference, then its Triton kernel
    M("rejection-accept-inverted", REJECTION, "accept = (u * q_d < p_d) & live", "accept = (u * q_d >= p_d) & live",
      "rejection sampler: a draft is accepted where it should be rejected (u q >= p)", (REJECTION_TESTS,),
      kernels("rejection")),
    M("rejection-accept-q-over-p", REJECTION, "accept = (u * q_d < p_d) & live", "accept = (u * p_d < q_d) & live",
      "rejection sampler: acceptance probability min(1, q/p), not min(1, p/q)", (REJECTION_TESTS,),
      kernels("rejection")),
    M("rejection-residual-is-p", REJECTION, "residual = (p_last - q_last).clamp(min=0)", "residual = p_last.clone()",
      "rejection sampler: the token after a rejection is drawn from p, not from max(0, p - q)", (REJECTION_TESTS,),
      kernels("rejection")),
    M("rejection-no-bonus", REJECTION, "    out[rows, n_acc] = token\n",
      "    out[rows, n_acc] = torch.where(rejected, token, -1)\n",
      "rejection sampler: no bonus token when every draft is accepted", (REJECTION_TESTS,), kernels("rejection")),
    M("rejection-bonus-position-off-by-one", REJECTION, "bonus_keys = row_keys(seeds, positions + n_acc)",
      "bonus_keys = row_keys(seeds, positions + n_acc + 1)",
      "rejection sampler: the bonus token's noise keyed one position late (not the plain sampler's draw)",
      (REJECTION_TESTS,), kernels("rejection")),
    M("rejection-recovered-from-q", REJECTION, "residual, p_last)", "q_last, p_last)",
      "rejection sampler: the token after a rejection is drawn from the draft's q", (REJECTION_TESTS,),
      kernels("rejection")),
    M("rejection-kernel-accept-inverted", REJECTION, "going = going & (u * q_tok < p_tok)",
      "going = going & (u * q_tok >= p_tok)", "Triton rejection sampler: a draft accepted where u q >= p",
      (REJECTION_TESTS,), kernels("rejection")),
    M("rejection-kernel-residual-is-p", REJECTION, "w = tl.maximum(p - q, 0.0)", "w = p",
      "Triton rejection sampler: the token after a rejection drawn from p, not max(0, p - q)", (REJECTION_TESTS,),
      kernels("rejection")),
    M("rejection-kernel-no-bonus", REJECTION, "tl.where(j == accepted, token, d)",
      "tl.where((j == accepted) & rejected, token, d)",
      "Triton rejection sampler: no bonus token when every draft is accepted", (REJECTION_TESTS,),
      kernels("rejection")),
    M("rejection-kernel-bonus-position-off-by-one", REJECTION,
      "key = tl.where(rejected, _pcg(plain ^ _RECOVER), plain)",
      "key = tl.where(rejected, _pcg(plain ^ _RECOVER), _pcg(seed_key + (pos + accepted + 1).to(tl.uint32)))",
      "Triton rejection sampler: the bonus token's noise keyed one position late", (REJECTION_TESTS,),
      kernels("rejection")),
    M("rejection-kernel-recovered-from-q", REJECTION, "w = tl.maximum(p - q, 0.0)",
      "w = tl.where(residual[:, None], q, p)",
      "Triton rejection sampler: the token after a rejection drawn from the draft's q", (REJECTION_TESTS,),
      kernels("rejection")),
    M("loader-kv-swap", "nanovllm_ref/layers/linear.py", '"k": kv, "v": kv}', '"v": kv, "k": kv}',
      "loader swaps the k and v shards of qkv_proj",
      (GOLDEN,)),
    # the Triton kernels that had no mutant: each reached by its kernel conformance case (CPU: the interpreter)
    M("silu-kernel-sign", "nanovllm_ref/kernels/activation.py", "act = (gate / (1.0 + tl.exp(-gate)))",
      "act = (gate / (1.0 + tl.exp(gate)))", "Triton SiLU-and-mul: sigmoid of -gate (exp sign flipped)",
      ("tests/attention/test_backends_end_to_end.py::test_silu_and_mul_kernel_matches_reference",), kernels("silu")),
    M("silu-kernel-one-column-block", "nanovllm_ref/kernels/activation.py",
      "offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)", "offs = tl.arange(0, BLOCK)",
      "Triton SiLU-and-mul: every column block of a wide row computes the first block",
      ("tests/attention/test_backends_end_to_end.py::test_silu_and_mul_kernel_matches_reference",), kernels("silu")),
    M("prefill-kernel-one-query-tile", "nanovllm_ref/kernels/prefill_attention.py",
      "tile = tl.num_programs(0) - 1 - tl.program_id(0)", "tile = 0 * tl.program_id(0)",
      "Triton prefill attention: every query tile of a long prompt computes the first tile",
      (KERNEL_ATTN,), kernels("prefill")),
    M("fused-moe-kernel-acc-reset", "nanovllm_ref/kernels/fused_moe.py",
      'acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")\n            else:\n'
      "                acc += tl.dot(a, w, input_precision=PREC)",
      'acc = tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")\n            else:\n'
      "                acc = tl.dot(a, w, input_precision=PREC)",
      "Triton fused MoE GEMM keeps only the last K tile (the accumulator overwritten, not added to)",
      ("tests/kernels/test_fused_moe.py::test_fused_moe_matches_reference",), kernels("fused_moe")),
    M("qkv-epilogue-v-from-k", "nanovllm_ref/kernels/qkv_epilogue.py", "        src = src + num_kv_heads * HEAD_DIM\n",
      "", "Triton fused QKV epilogue stores the raw K slice as V", ("tests/kernels/test_kernel_qkv_epilogue.py",),
      kernels("qkv_epilogue")),
    # sampling: each caught by the sampling conformance test (what another engine runs)
    M("sampling-top-p-drops-boundary", "nanovllm_ref/layers/sampler.py",
      "drop = probs.cumsum(dim=-1) <= 1 - top_p", "drop = probs.cumsum(dim=-1) - probs <= 1 - top_p",
      "top-p drops the token that crosses p (the nucleus falls short of p)",
      (f"{SAMPLING_CONF}::test_sampling_distribution",)),
    M("sampling-top-p-keeps-one-more", "nanovllm_ref/layers/sampler.py",
      "drop = probs.cumsum(dim=-1) <= 1 - top_p", "drop = probs.cumsum(dim=-1) + probs.roll(-1, -1) <= 1 - top_p",
      "top-p keeps the token after the one that crosses p", (f"{SAMPLING_CONF}::test_sampling_distribution",)),
    M("sampling-temperature-after-top-p", "nanovllm_ref/layers/sampler.py",
      "scores = logits.float() / torch.where(temperature > 0, temperature, 1.0)[:, None]\n"
      "    if top_k is not None:\n        scores = apply_top_k_top_p(scores, top_k, top_p)\n",
      "scores = logits.float()\n    if top_k is not None:\n        scores = apply_top_k_top_p(scores, top_k, top_p)\n"
      "    scores = scores / torch.where(temperature > 0, temperature, 1.0)[:, None]\n",
      "temperature applied after top-k/top-p (the nucleus of the unscaled distribution)",
      (f"{SAMPLING_CONF}::test_sampling_distribution",)),
    M("sampling-repetition-penalty-sign", "nanovllm_ref/layers/logits_processing.py",
      "torch.where(x < 0, x * rep, x / rep)", "torch.where(x < 0, x / rep, x * rep)",
      "repetition penalty pushes negative logits up and positive ones down (the sign test inverted)",
      (f"{SAMPLING_CONF}::test_sampling_distribution",)),
    M("sampling-min-p-wrong-max", "nanovllm_ref/layers/sampler.py", "top = probs.amax(dim=-1, keepdim=True)",
      "top = 1.0", "min-p threshold against probability 1, not the most likely token's",
      (f"{SAMPLING_CONF}::test_sampling_distribution",)),
    M("sampling-presence-frequency-swapped", "nanovllm_ref/layers/logits_processing.py",
      'column("frequency_penalty") * counts - column("presence_penalty") * (counts > 0)',
      'column("presence_penalty") * counts - column("frequency_penalty") * (counts > 0)',
      "presence and frequency penalties swapped", (f"{SAMPLING_CONF}::test_sampling_distribution",)),
    M("sampling-penalties-count-prompt", "nanovllm_ref/layers/logits_processing.py",
      "float(p >= r.num_prompt_tokens)", "float(p >= 0)",
      "presence/frequency penalties count prompt tokens too (OpenAI/vLLM: output tokens only)",
      (f"{SAMPLING_CONF}::test_sampling_distribution",)),
    M("sampling-min-tokens-one-short", "nanovllm_ref/layers/logits_processing.py",
      "< r.params.min_tokens for t in r.stop_ids", "< r.params.min_tokens - 1 for t in r.stop_ids",
      "min_tokens masks EOS for one token too few", (f"{SAMPLING_CONF}::test_sampling_distribution",)),
    M("sampling-n-shared-seed", "nanovllm_ref/engine/llm_engine.py", "seed = (base + i + 2**63)",
      "seed = (base + 2**63)", "the n samples of a request share one seed (n copies of one sample)",
      (f"{SAMPLING_CONF}::test_seeded_samples_reproducible_one_by_one",
       f"{SAMPLING_CONF}::test_sampling_distribution")),
    # async prefill: steps with prefill chunks launched behind the one in flight
    M("async-prefill-ids-by-order", "nanovllm_ref/engine/overlap.py",
      "dst, src = zip(*fed)", "dst, src = [d for d, _ in fed], range(len(fed))",
      "async scheduling feeds a step's rows the step in flight's tokens by order, not by sequence",
      ("tests/engine/test_async_scheduling.py",)),
    M("async-fill-never-finishes", "nanovllm_ref/engine/overlap.py",
      "        return self.take_tokens(out, sampled)\n",
      "        for seq, _ in out.scheduled:\n            if seq.seq_id in sampled and not seq.is_finished:\n"
      "                seq.token_ids.append(sampled[seq.seq_id])\n        return []\n",
      "a token sampled in a step scheduled past (async) never ends its request (stop token, max_tokens): the overlap "
      "appends it without the scheduler's finish rules",
      (SCHED, "tests/engine/test_async_scheduling.py")),
    # penalties over many steps, logprobs modes, seeds, cached tokens, TP in bfloat16, the RMSNorm residual: each
    # caught by `pytest conformance` alone (the module named first)
    M("sampling-frequency-once-per-token", "nanovllm_ref/layers/logits_processing.py",
      "counts.index_put_(at, torch.tensor(is_output, device=device), accumulate=True)",
      "counts.index_put_(at, torch.tensor(is_output, device=device), accumulate=False)",
      "frequency penalty counts a token once however often it was output (the counts are set, not added to)",
      (STEPS_CONF,), (STEPS_CONF,)),
    M("sampling-penalty-counts-per-request", "nanovllm_ref/engine/inputs.py",
      "seq.stop_ids, seq.seq_id))",
      "seq.stop_ids, abs(hash(seq.request_id)) % 2**62))",
      "the penalty counts kept across steps are keyed by request: the n samples of one share (and mix) them",
      (STEPS_CONF,), (STEPS_CONF,)),
    M("sampling-processed-rows-not-remapped", "nanovllm_ref/engine/inputs.py",
      "step.processed.append(ProcessedRow(len(sampling_rows), seq.params, seq.token_ids,",
      "step.processed.append(ProcessedRow(len(step.processed), seq.params, seq.token_ids,",
      "a penalized row is numbered among the processed rows, not the step's sampling rows (another row's logits)",
      (STEPS_CONF,), (STEPS_CONF,)),
    M("sampling-presence-as-frequency", "nanovllm_ref/layers/logits_processing.py",
      '- column("presence_penalty") * (counts > 0)', '- column("presence_penalty") * counts',
      "presence penalty applied per occurrence, like the frequency penalty", (STEPS_CONF,), (STEPS_CONF,)),
    M("sampling-repetition-output-only", "nanovllm_ref/layers/logits_processing.py", "seen[at] = True",
      "seen[at] = torch.tensor(is_output, device=device) > 0",
      "repetition penalty over output tokens only (transformers and vLLM: prompt and output)", (STEPS_CONF,),
      (STEPS_CONF,)),
    M("logprobs-raw-logits-reports-processed", "nanovllm_ref/layers/logits_processing.py",
      '"raw_logits": logits.float()[idx]', '"raw_logits": proc',
      "logprobs_mode raw_logits reports the processed logits", (STEPS_CONF,), (STEPS_CONF,)),
    M("logprobs-raw-reports-processed", "nanovllm_ref/layers/logits_processing.py",
      "    if processed is None:\n        return scores\n",
      "    if processed is None:\n        return scores\n    scores[processed[0]] = processed[1].log_softmax(dim=-1)\n",
      "raw_logprobs (the default) reports processed logprobs for rows with penalties, bias or min_tokens",
      (STEPS_CONF,), (STEPS_CONF,)),
    M("seed-unseeded-shared", "nanovllm_ref/engine/llm_engine.py", "else self._rng.getrandbits(63)",
      "else random.Random(self.config.seed).getrandbits(63)",
      "unseeded requests all draw from one stream (a fresh generator from the engine seed per request)",
      (STEPS_CONF,), (STEPS_CONF,)),
    M("seed-decode-counter-row", "nanovllm_ref/engine/inputs.py",
      "sampling_rows.append(seq.sampling_row + (len(step.logits_indices), end))",
      "sampling_rows.append(seq.sampling_row + (len(step.logits_indices), end + len(sampling_rows)))",
      "seeded draws depend on the request's row in the batch", (STEPS_CONF,), (STEPS_CONF,)),
    M("prefix-cache-free-head-first", "nanovllm_ref/engine/block_manager.py",
      "for block_id in reversed(seq.block_table):", "for block_id in seq.block_table:",
      "a finished request's blocks are freed head first: its prefix is evicted before its suffix",
      (CACHE_CONF,), (CACHE_CONF,)),
    M("cached-tokens-in-blocks", "nanovllm_ref/engine/scheduler.py",
      "seq.num_cached_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)",
      "seq.num_cached_tokens = len(cached)", "num_cached_tokens counts cached blocks, not tokens",
      (CACHE_CONF,), (CACHE_CONF,)),
    M("cached-tokens-recounted-after-preemption", "nanovllm_ref/engine/scheduler.py",
      "if seq.num_preemptions == 0:", "if True:",
      "num_cached_tokens re-set at the re-admission after a preemption (its own recomputed blocks counted)",
      (CACHE_CONF,), (CACHE_CONF,)),
    M("async-decode-claims-block-past-length", "nanovllm_ref/engine/scheduler.py",
      "if num_tokens >= seq.max_num_tokens:", "if False:",
      "async decode claims (and evicts) a block for a row that the step in flight ends by length",
      ("tests/engine/test_async_block_claim.py",), (CACHE_CONF, *ASYNC)),
    M("tp-allreduce-bf16-as-fp16-bits", "nanovllm_ref/distributed.py", "y = x.float()  # gloo",
      "y = x.view(torch.float16).float()  # gloo",
      "TP all-reduce of bfloat16 partial sums reads their bits as float16 (view for to)",
      TP_BF16, TP_BF16),
    M("rmsnorm-kernel-residual-not-updated", "nanovllm_ref/kernels/rmsnorm.py",
      "tl.store(res_out_ptr + at, x, mask=mask)", "tl.store(res_out_ptr + at, r, mask=mask)",
      "Triton fused add + RMSNorm returns the old residual, not x + residual",
      kernels("rms_norm"), kernels("rms_norm")),
    M("rmsnorm-kernel-residual-input-returned", "nanovllm_ref/kernels/rmsnorm.py",
      "return out if residual is None else (out, res_out.view(shape))",
      "return out if residual is None else (out, residual)",
      "Triton fused add + RMSNorm hands back its residual input unchanged",
      kernels("rms_norm"), kernels("rms_norm")),
    M("sdpa-decode-scale", "nanovllm_ref/attention/sdpa_backend.py",
      "scores = scores.mul_(self.scale).add_(plan.mask)", "scores = scores.mul_(self.scale * 0.9).add_(plan.mask)",
      "sdpa backend: decode steps scale scores by 0.9/sqrt(d), prefill right (caught without any reference: "
      "decode-time logprobs disagree with a re-prefill)", (SDPA_ORACLE,),
      ("conformance/test_self_consistency.py", "--reference", "none")),
    # text: what users read (detokenization, stop strings, finish and stop reasons, streaming, n samples)
    M("text-context-only-with-stop", ENGINE_PY, "IncrementalDetokenizer(self.tokenizer, token_ids, params)",
      "IncrementalDetokenizer(self.tokenizer, token_ids if params.stop else [], params)",
      "requests without stop strings are decoded without the prompt as context (a word-level text loses its "
      "leading space)", (DETOK_TESTS,), (TEXT_CONF, *WORDS)),
    M("text-partial-utf8-flushed", DETOK, "piece = step(backend, token)\n",
      "piece = step(backend, token) or self.tokenizer.decode([token])\n",
      "a token that leaves a character incomplete adds its own decoding (U+FFFD) to the text and the stream",
      (DETOK_TESTS,), (TEXT_CONF,)),
    M("text-stop-reason-none", ENGINE_PY, 'seq.finish_reason, seq.stop_reason = "stop", found',
      'seq.finish_reason = "stop"', "a stop string ends the request but stop_reason stays None",
      (DETOK_TESTS,), (TEXT_CONF,)),
    M("text-eos-reported-as-stop-id", ENGINE_PY, "else token != self.primary_eos",
      "else True", "a request ended by EOS reports the EOS id as stop_reason (vLLM: None)", (DETOK_TESTS,),
      (TEXT_CONF,)),
    M("text-length-over-stop-string", ENGINE_PY, 'seq.finish_reason, seq.stop_reason = "stop", found',
      "seq.stop_reason = found", "a stop string completed by the last allowed token leaves finish_reason "
      '"length"', (DETOK_TESTS,), (TEXT_CONF,)),
    M("text-include-stop-str-ignored", DETOK, "self.text = self.text[: at + (len(s) if self.include_stop else 0)]",
      "self.text = self.text[:at]", "include_stop_str_in_output ignored: the stop string is always cut",
      (DETOK_TESTS,), (TEXT_CONF,)),
    M("text-stop-string-inside-min-tokens", DETOK,
      "self.min_tokens - self.num_fed))  # tokens within the first min_tokens\n        if early:\n            self.text"
      " += self._pieces(tokens[:early])  # never a stop string's end\n        start = len(self.text)\n        self.text"
      " += self._pieces(tokens[early:])\n        self.num_fed += len(token_ids)\n        if self.stop and "
      "self.num_fed > self.min_tokens",
      "self.min_tokens - self.num_fed - 1))\n        if early:\n            self.text += self._pieces(tokens[:early])\n"
      "        start = len(self.text)\n        self.text += self._pieces(tokens[early:])\n        self.num_fed += "
      "len(token_ids)\n        if self.stop and self.num_fed >= self.min_tokens",
      "a stop string completed by the min_tokens-th token stops the request (checked one token early)",
      (DETOK_TESTS,), (TEXT_CONF,)),
    M("text-skip-special-ignored", DETOK, "self.skip_special = params.skip_special_tokens",
      "self.skip_special = True", "skip_special_tokens=False ignored: special tokens never in the text",
      (DETOK_TESTS,), (TEXT_CONF,)),
    M("text-samples-share-detokenizer", ENGINE_PY,
      "seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params)",
      "seq.detokenizer = seqs[0].detokenizer if seqs else IncrementalDetokenizer(self.tokenizer, token_ids, params)",
      "the n samples of a request share one detokenizer (one text state)", (DETOK_TESTS,), (TEXT_CONF,)),
    M("text-stop-token-text-kept", DETOK,
      'on_stop_token = seq.is_finished and seq.finish_reason == "stop" and seq.stop_reason is None',
      "on_stop_token = False", "the text of the stop token (EOS, stop_token_ids) is kept without "
      "include_stop_str_in_output", (DETOK_TESTS,), (TEXT_CONF,)),
    M("text-spaces-between-specials-ignored", DETOK,
      "if not (params.skip_special_tokens or params.spaces_between_special_tokens):", "if False:",
      "spaces_between_special_tokens=False ignored (a word-level decoder's spaces stay)", (DETOK_TESTS,),
      (TEXT_CONF, *WORDS)),
    M("text-stream-holds-nothing", DETOK, "max(self.streamed, len(self.text) - self.hold)", "len(self.text)",
      "streaming does not hold back a possible stop string's beginning, which the stop then cuts",
      (DETOK_TESTS, "tests/engine/test_step_outputs.py"), (TEXT_CONF,)),
    # FP8 KV cache: caught by the fp8-kv tier (conformance/test_fp8_kv.py; its kernel check runs the Triton kernels
    # in the interpreter on the CPU, compiled with -m gpu)
    M("fp8-scale-twice", "nanovllm_ref/kernels/kv_quant.py", "    return x.float() * scale.view(shape)",
      "    return x.float() * scale.view(shape) * scale.view(shape)",
      "FP8 KV: the cache's values dequantized with the scale applied twice", (FP8_ENGINE,), FP8_TIER),
    M("fp8-scale-wrong-axis", "nanovllm_ref/kernels/kv_quant.py", "    return kv_scales[0], kv_scales[1]",
      "    k_scale, v_scale = kv_scales.reshape(-1, 2).t()\n    return k_scale, v_scale",
      "FP8 KV: a layer's (2, kv_heads) scales read as (kv_heads, 2): K and V scales mixed across heads",
      (FP8_ENGINE,), FP8_TIER),
    M("fp8-no-saturation", "nanovllm_ref/kernels/_triton_common.py",
      "        x = tl.minimum(tl.maximum(x, -448.0), 448.0)\n", "",
      "FP8 KV Triton store: no clamp to +-448 before the e4m3 conversion (out-of-range values wrap or turn NaN)",
      (FP8_KERNELS,), FP8_TIER, gpu_equivalent="compiled for sm_89+, Triton converts to e4m3 with "
      "cvt.rn.satfinite, which saturates by itself: the clamp matters to the interpreter and other backends"),
    M("fp8-dequant-wrong-dtype", "nanovllm_ref/kernels/prefill_attention.py", "dequantize_kv(x.view(FP8), ",
      "dequantize_kv(x, ", "FP8 KV (sdpa, the CPU default): the cache's bytes dequantized as uint8, not e4m3",
      (FP8_ENGINE,), FP8_TIER),
    M("fp8-prefix-hit-unscaled", "nanovllm_ref/attention/sdpa_backend.py",
      "k, v = self._gather(k_cache, v_cache, plan, plan.width)",
      "k, v = (x / s.view(-1, 1, 1) for x, s in zip(self._gather(k_cache, v_cache, plan, plan.width), self.kv_scales))",
      "FP8 KV: a step after a prefix-cache hit (queries after cached keys) reads the cached blocks without their "
      "scale (a stale scale of 1)", (FP8_ENGINE,), FP8_TIER),
    M("fp8-decode-k-scale-twice", "nanovllm_ref/kernels/decode_attention.py",
      "qk_scale = qk_scale * tl.load(kv_scale_ptr + kvh)",
      "qk_scale = qk_scale * tl.load(kv_scale_ptr + kvh) * tl.load(kv_scale_ptr + kvh)",
      "FP8 KV Triton decode: the K scale folded into the softmax scale twice", (FP8_KERNELS,), FP8_TIER),
    M("fp8-decode-v-scale-axis", "nanovllm_ref/kernels/decode_attention.py",
      "acc = acc * tl.load(kv_scale_ptr + num_kv_heads + kvh)", "acc = acc * tl.load(kv_scale_ptr + 2 * kvh + 1)",
      "FP8 KV Triton decode: the V scale read from a (kv_heads, 2) layout", (FP8_KERNELS,), FP8_TIER),
    # the Gluon fp8 decode kernel (head_dim 128 on sm_90 GPUs only): caught on CUDA by the fp8 tier's kernel check
    # at head_dim 128 (tools/mutants_gpu.py runs it)
    M("fp8-gluon-k-scale-twice", GLUON_FP8, "qk_scale = qk_scale * gl.load(kv_scale_ptr + kvh)",
      "qk_scale = qk_scale * gl.load(kv_scale_ptr + kvh) * gl.load(kv_scale_ptr + kvh)",
      "FP8 KV Gluon decode: the K scale folded into the softmax scale twice", (GLUON_TESTS,), FP8_KERNEL_CHECK,
      gpu=True),
    M("fp8-gluon-v-scale-axis", GLUON_FP8, "acc = acc * gl.load(kv_scale_ptr + num_kv_heads + kvh)",
      "acc = acc * gl.load(kv_scale_ptr + 2 * kvh + 1)", "FP8 KV Gluon decode: the V scale read from a (kv_heads, 2) "
      "layout", (GLUON_TESTS,), FP8_KERNEL_CHECK, gpu=True),
    M("fp8-gluon-cvt-halves-swapped", GLUON_FP8, "cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi;",
      "cvt.rn.f16x2.e4m3x2 $0, hi; cvt.rn.f16x2.e4m3x2 $1, lo;",
      "FP8 KV Gluon decode: a register's two e4m3 pairs converted into each other's float16 halves",
      (GLUON_TESTS,), FP8_KERNEL_CHECK, gpu=True),
    M("fp8-gluon-tail-mask", GLUON_FP8, "s = gl.where((n0 + keys < end)[:, None]",
      "s = gl.where((n0 + keys <= end)[:, None]",
      "FP8 KV Gluon decode: the tile mask keeps one key past the split's end (a zero-filled or next split's key)",
      (GLUON_TESTS,), FP8_KERNEL_CHECK, gpu=True),
    # batch-invariant mode (kernels/matmul.py, kernels/invariant_attention.py): caught by the invariance module in
    # exact mode with the mode on; the CUDA sites by the same module on the GPU (bf16)
    M("batch-invariant-gemm-fallback", "nanovllm_ref/kernels/matmul.py",
      "    return invariant_linear if use_kernels else invariant_linear_reference\n",
      "    product = invariant_linear if use_kernels else invariant_linear_reference\n"
      "    return lambda x, weight, bias=None: (product if x.shape[0] >= 8 else F.linear)(x, weight, bias)\n",
      "batch-invariant mode: steps of under 8 rows (a lone decode) take the BLAS's own product", (INVARIANT_TESTS,),
      INVARIANCE_EXACT),
    M("batch-invariant-split-by-batch", "nanovllm_ref/kernels/invariant_attention.py",
      "tile = KEY_TILE  # never chosen by the batch or the chunk",
      "tile = KEY_TILE if seq_lens.shape[0] > 1 else -(-int(seq_lens.max()) // KEY_TILE) * KEY_TILE",
      "batch-invariant attention (CPU): a lone sequence reduces its keys in one split, a batch in tiles",
      (INVARIANT_TESTS,), INVARIANCE_EXACT),
    M("batch-invariant-chunk-rows", "nanovllm_ref/kernels/invariant_attention.py",
      "tokens = max(1, UNIT_ROWS // group)", "tokens = max(1, int(query_start_loc.diff().max()))",
      "batch-invariant attention (CPU): a product's rows are the step's longest chunk, so its shape follows the chunk",
      # one query head per KV head: a lone decode's product is then one row, which MKL computes as a matrix-vector
      # product with other bits than the 16-row one (with GQA groups of 2 and more, its products' bits may agree)
      (INVARIANT_TESTS,), (*INVARIANCE_EXACT, "--model", "qwen3-bias-hd32")),
    M("batch-invariant-decode-split", "nanovllm_ref/attention/triton_backend.py",
      "tile_config=invariant_decode_tile()) if self.batch_invariant else",
      "tile_config=invariant_decode_tile()) if False else",
      "batch-invariant mode (CUDA): decode steps take the split-K decode kernel, its split count chosen by the batch",
      (INVARIANT_TESTS,), INVARIANCE_EXACT, gpu=True, gpu_args=INVARIANCE_CUDA),
    M("batch-invariant-prefill-tile-by-chunk", "nanovllm_ref/attention/triton_backend.py",
      "tile = invariant_prefill_tile(self.num_heads, self.num_kv_heads) if",
      "tile = {**invariant_prefill_tile(self.num_heads, self.num_kv_heads), "
      "'BLOCK_N': 64 if meta.max_query_len == 1 else 32} if",
      "batch-invariant mode (CUDA): steps with prompt chunks reduce keys 32 at a time, decode steps 64 at a time",
      (INVARIANT_TESTS,), INVARIANCE_EXACT, gpu=True, gpu_args=INVARIANCE_CUDA),
    M("batch-invariant-gemm-split-small", "nanovllm_ref/kernels/matmul.py", "    return out.view(*shape[:-1], n)",
      "    if 1 < m <= 64:\n        h = k // 2\n        out = ((x2[:, :h] @ weight[:, :h].T).float()"
      " + (x2[:, h:] @ weight[:, h:].T).float() + (0 if bias is None else bias.float())).to(x.dtype)\n"
      "    return out.view(*shape[:-1], n)",
      "batch-invariant GEMM (CUDA): steps of 2-64 rows take a split-K product (two halves of K summed)",
      (INVARIANT_TESTS,), INVARIANCE_EXACT, gpu=True, gpu_args=INVARIANCE_CUDA),
    # the blind spots of a held-out audit: each caught by a check any engine runs
    # the engine's advertised modes get the goldens in the default run (conformance/test_engine_modes.py)
    M("batch-invariant-gemm-last-tile-skipped", "nanovllm_ref/kernels/matmul.py",
      "for a in range(0, x2.shape[0], ROW_TILE):", "for a in range(0, x2.shape[0] - ROW_TILE, ROW_TILE):",
      "batch-invariant GEMM (CPU): the last row tile is never multiplied (its rows keep what the buffer held)",
      (INVARIANT_TESTS,), ("conformance/test_engine_modes.py",)),
    M("batch-invariant-attention-skips-diagonal", "nanovllm_ref/kernels/invariant_attention.py",
      "s.masked_fill(key_pos[j : j + tile] > row_pos", "s.masked_fill(key_pos[j : j + tile] >= row_pos",
      "batch-invariant attention (CPU): the causal mask also hides each query's own key",
      (INVARIANT_TESTS,), ("conformance/test_engine_modes.py",)),
    M("serve-stream-text-offset-restarts", ROUTES, "start, offsets.get(c.index, 0))", "start)",
      "streamed /v1/completions with logprobs: each chunk's text_offset restarts at 0 (non-streamed is right)",
      (SERVE_TESTS,), (SERVING_CONF,)),
    M("serve-chat-stream-logprobs-repeated", ROUTES, '"logprobs": _chat_logprobs(served, c, start, top, as_ids),',
      '"logprobs": _chat_logprobs(served, c, 0, top, as_ids),',
      "streamed chat completions: each chunk's logprobs repeat every token from the first", (SERVE_TESTS,),
      (SERVING_CONF,)),
    M("text-stop-found-only-at-the-end", DETOK, "self.text.find(s, max(0, new_from - len(s) + 1))",
      "self.text.find(s, max(0, len(self.text) - len(s)))",
      "stop strings searched only where they would end the text: of two one token completes, the later wins and "
      "the earlier stays in the text", (DETOK_TESTS,), (TEXT_CONF,)),
    M("seed-zero-unseeded", ENGINE_PY, "params.seed if params.seed is not None else", "params.seed if params.seed else",
      "a request seeded 0 is taken as unseeded (a fresh draw of the engine's generator)", (STEPS_CONF,), (SEEDS_CONF,)),
    M("seed-engine-seed-ignored", ENGINE_PY, "self._rng = random.Random(config.seed)", "self._rng = random.Random()",
      "the engine-level seed is ignored: unseeded requests draw differently on every instance", (STEPS_CONF,),
      (SEEDS_CONF,)),
    M("abort-first-sample-only", ENGINE_PY, '''        for s in seq.group or [seq]:
            self.scheduler.finish(s, "abort")''',
      '''        for s in [seq]:
            self.scheduler.finish(s, "abort")''',
      "aborting a request with n > 1 aborts its first sample only (the others run on, its output never returned)",
      ("tests/engine/test_request_errors.py",), (ABORT_CONF,)),
    M("eos-config-list-first-only", "nanovllm_ref/config.py",
      '"eos_token_id": tuple(eos) if isinstance(eos, list) else eos,',
      '"eos_token_id": eos[0] if isinstance(eos, list) else eos,',
      "config.json's eos_token_id list read as its first id only (generation_config.json's list still honoured)",
      (ENGINE,), ("conformance/test_eos.py",)),
    M("top-p-tiny-drops-every-token", "nanovllm_ref/layers/sampler.py", "    drop[:, -1] = False\n", "",
      "top-p does not keep the most likely token explicitly: a tiny top_p (1 - top_p rounds to 1) drops them all",
      (SAMPLING,), (EDGES_CONF,)),
    M("processed-rows-ignore-top-p", "nanovllm_ref/layers/logits_processing.py",
      "filters = any(r.params.top_k > 0 or r.params.top_p < 1 for r in rows)",
      "filters = any(r.params.top_k > 0 for r in rows)",
      "rows with penalties, logit_bias or min_p (the torch path) ignore top_p unless they also have top_k",
      ("tests/layers/test_logits_processing.py",), (EDGES_CONF,)),
    M("min-tokens-alone-not-processed", "nanovllm_ref/sampling_params.py",
      "self.min_p > 0 or self.min_tokens > 0 or", "self.min_p > 0 or",
      "min_tokens alone does not take the processing path: its stop tokens are never masked",
      ("tests/layers/test_logits_processing.py",), (EDGES_CONF,)),
    M("prefix-cache-uncached-freed-last", "nanovllm_ref/engine/block_manager.py",
      "self.free_queue.move_to_end(block_id, last=False)", "pass",
      "a freed block holding nothing cached (a partial last block) queues behind cached blocks, which are evicted "
      "before it", (BLOCKS,), (CACHE_CONF,)),
    M("sampler-kernel-finite-of-best-chunk", "nanovllm_ref/kernels/sampling.py",
      "tl.min(finite, axis=0).to(tl.int64)", "tl.sum(tl.where(offs == best, finite, 0), axis=0).to(tl.int64)",
      "Triton sampler: a row's finite flag is its best chunk's, so a NaN elsewhere in a large vocabulary passes",
      ("tests/kernels/test_kernel_sampling.py",), kernels("gumbel_sample")),
    M("gemm-kernel-split-past-k", "nanovllm_ref/kernels/matmul.py", "k_hi = tl.minimum(K, k_lo + K_SPLIT)",
      "k_hi = k_lo + K_SPLIT", "batch-invariant GEMM: the last K split runs a full K_SPLIT, past K (the next row's "
      "weights) where the splits do not divide K", (INVARIANT_TESTS,), kernels("invariant_linear")),
    M("decode-kernel-partials-by-program", "nanovllm_ref/kernels/decode_attention.py",
      "row = (seq.to(tl.int64) * (group * num_kv_heads) + heads) * num_splits + split",
      "row = ((pid // (num_splits * num_kv_heads)).to(tl.int64) * (group * num_kv_heads) + heads) * num_splits"
      " + split", "Triton split-K decode: partials stored by the program's place, not its sequence (right only "
      "when the engine's longest-first order is the identity)", (KERNEL_ATTN,), kernels("decode_attention")),
    M("fp8-prefill-v-scale-from-k", "nanovllm_ref/kernels/prefill_attention.py",
      "acc = acc * tl.load(kv_scale_ptr + num_kv_heads + kvh)", "acc = acc * tl.load(kv_scale_ptr + kvh)",
      "FP8 KV Triton prefill: the output scaled by the K scale instead of the V scale", (FP8_KERNELS,),
      FP8_KERNEL_CHECK),
    # structured outputs: each caught by conformance/test_structured*.py alone
    M("structured-mask-shifted", "nanovllm_ref/kernels/token_bitmask.py",
      "reshape(m, words * 32)[:, :vocab].bool()", "reshape(m, words * 32).roll(1, dims=1)[:, :vocab].bool()",
      "structured outputs: the bitmask applied one token off (token v takes the bit of token v - 1)",
      (BITMASK_TESTS,), STRUCT_CONF),
    M("structured-mask-after-sampling", RUNNER,
      "            self._apply_bitmask(sample_logits, step)\n        batch = SamplingBatch(",
      "        batch = SamplingBatch(",
      "structured outputs: the bitmask applied after the draw (tokens unconstrained; the logprobs still masked)",
      (STRUCT_MANAGER,), STRUCT_CONF),
    M("structured-eos-only-at-the-end", MANAGER,
      "        tracked.matcher.fill_next_token_bitmask(view, i)\n",
      "        tracked.matcher.fill_next_token_bitmask(view, i)\n        words = mask[i].view(np.uint32)\n"
      "        for t in tracked.stop_ids:\n            words[t // 32] &= ~np.uint32(1 << (t % 32))\n",
      "structured outputs: EOS not allowed where the grammar accepts and could go on (only once nothing else is)",
      (STRUCT_MANAGER,), STRUCT_CONF),
    M("structured-rejected-drafts-kept", MANAGER, "        matcher.rollback(len(consumed) - same)\n", "",
      "structured outputs under speculative decoding: the grammar state not rolled back past rejected drafts (the "
      "matcher stays where the drafts took it; the next tokens are accepted from there)",
      (STRUCT_MANAGER, SPEC_TESTS), ("conformance/test_structured.py", "-k", "speculative")),
    M("structured-mask-of-another-row", MANAGER, "return mask, [r.row for r in rows]",
      "return mask, [r.row for r in rows[1:] + rows[:1]]",
      "structured outputs: each structured row masked with the next structured row's bitmask",
      (STRUCT_MANAGER,), STRUCT_CONF),
    M("structured-rows-among-structured", MANAGER, "return mask, [r.row for r in rows]",
      "return mask, list(range(len(rows)))",
      "structured outputs: bitmask rows numbered among the structured rows, not the step's sampling rows (right "
      "only when no plain request is in the batch)", (STRUCT_MANAGER,), STRUCT_CONF),
    M("structured-logprobs-unmasked", RUNNER, STRUCT_SAMPLE_BLOCK, STRUCT_SAMPLE_BLOCK_UNMASKED,
      "structured outputs: logprobs of the unmasked distribution (not renormalized over the allowed tokens)",
      (STRUCT_MANAGER,), STRUCT_CONF),
    M("structured-byte-fallback-as-latin1", "nanovllm_ref/structured/vocab.py", "            encoded[i] = token\n",
      '            encoded[i] = chr(int(token[3:5], 16)) if len(token) == 6 and token.startswith("<0x") else token\n',
      "structured outputs: a byte-fallback token <0xNN> given xgrammar as the character U+00NN (right for ASCII, "
      "two bytes for NN >= 0x80)", (STRUCT_VOCAB,), STRUCT_SPM),
    # speculative decoding (engine/scheduler.py, verify.py, inputs.py, detokenizer.py)
    M("spec-kv-rollback-missing", SCHED_PY,
      "num_new -= len(seq.draft_tokens) - self._take_accepted(seq, sampled, accepted.get(seq.seq_id, []))",
      "self._take_accepted(seq, sampled, accepted.get(seq.seq_id, []))",
      "speculative decoding: every draft counted as computed, the rejected ones too (no KV rollback)", (SPEC_TESTS,),
      SPEC_CONF),
    M("spec-accepted-off-by-one", VERIFY_PY, "out.sampled[seq_id], out.accepted[seq_id] = rows[a], drafts[:a]",
      "out.sampled[seq_id], out.accepted[seq_id] = rows[a], drafts[: a + 1]",
      "speculative decoding: the first rejected draft is accepted too", (SPEC_TESTS,), SPEC_CONF),
    M("spec-rejected-logprobs-kept", VERIFY_PY, "out.logprobs[seq_id] = out.logprobs[seq_id][: a + 1]",
      "out.logprobs[seq_id] = out.logprobs[seq_id]",
      "speculative decoding: the logprobs of the rows after a rejection are kept (one entry per row, not per token)",
      (SPEC_TESTS,), SPEC_CONF),
    M("spec-verify-rows-one-position", INPUTS_PY,
      "sampling_rows.append(seq.sampling_row + (len(step.logits_indices), n + i))",
      "sampling_rows.append(seq.sampling_row + (len(step.logits_indices), n))",
      "speculative decoding: every verify row of a sequence draws with its first row's counter (the same noise across "
      "a rejection and the bonus)", (SPEC_TESTS,), SPEC_SAMPLING),
    M("spec-blocks-hashed-with-drafts", SCHED_PY,
      "            if seq.draft_tokens:\n                num_new -= len(",
      "            if seq.draft_tokens:\n                known, seq.token_ids = seq.token_ids, seq.token_ids + "
      "seq.draft_tokens\n                seq.num_computed_tokens += num_new\n                "
      "self.block_manager.cache_full_blocks(seq)\n                seq.token_ids, seq.num_computed_tokens = known, "
      "seq.num_computed_tokens - num_new\n                num_new -= len(",
      "speculative decoding: blocks hashed before the rollback, with every draft in them (a rejected draft's hash on "
      "a block whose KV the next step overwrites)", (SPEC_TESTS,), SPEC_CONF),
    M("spec-stop-token-in-accepted-run-ignored", SCHED_PY,
      "if token in seq.stop_ids or len(seq.token_ids) + 1 >= seq.max_num_tokens:",
      "if len(seq.token_ids) + 1 >= seq.max_num_tokens:",
      "speculative decoding: a stop token among the accepted drafts does not end the output", (SPEC_TESTS,),
      SPEC_CONF),
    M("spec-stop-string-after-the-step", DETOK, "if len(tokens) == 1 or not detok.stop:", "if True:",
      "speculative decoding: a step's tokens detokenized at once, so tokens after the one completing a stop string "
      "stay in the output", (SPEC_TESTS,), SPEC_CONF),
    M("spec-bonus-row-dropped", INPUTS_PY, "for i, token in enumerate([seq.token_ids[-1], *drafts]):",
      "for i, token in enumerate([seq.token_ids[-1], *drafts[:-1]]):",
      "speculative decoding: no bonus row (a sequence's rows are its drafts'; the verification reads the next one's)",
      (SPEC_TESTS,), SPEC_CONF),
    M("spec-bonus-token-dropped", VERIFY_PY, "out.sampled[seq_id], out.accepted[seq_id] = rows[a], drafts[:a]",
      "out.sampled[seq_id], out.accepted[seq_id] = (rows[a], drafts[:a]) if a < len(drafts) else (drafts[-1], "
      "drafts[:-1])", "speculative decoding: a step whose drafts are all accepted emits no bonus token (the same "
      "tokens, one step later; its last draft counted as not accepted)", (SPEC_TESTS,), SPEC_CONF),
    M("spec-verify-keys-carried", "nanovllm_ref/attention/sdpa_backend.py",
      "if (prev.last is None or not prev.carried or prev.width > plan.width",
      "if (prev.last is None or prev.width > plan.width",
      "speculative decoding, sdpa: a decode step extends a verify step's gathered keys (its rejected rows' keys are "
      "stale)", ("tests/attention/test_sdpa_backend.py::test_sdpa_decode_step_after_a_verify_step_gathers_afresh",),
      SPEC_CONF),
    M("spec-penalty-rows-ignore-drafts", INPUTS_PY, "tokens = seq.token_ids + drafts[:i] if i else seq.token_ids",
      "tokens = seq.token_ids", "speculative decoding: a verify row's penalties ignore the drafts before it",
      (SPEC_TESTS,), SPEC_SAMPLING),
    M("prefix-cache-copy-lost-on-eviction", "nanovllm_ref/engine/block_manager.py",
      "self.cached[block.hash] = copies.pop(0)", "copies.pop(0)",
      "evicting the cached one of two blocks with the same content loses it, though the other still holds it",
      (BLOCKS,), (CACHE_CONF,)),
    M("moe-router-softmax-bf16", "nanovllm_ref/models/qwen3_moe.py",
      "probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)", "probs = torch.softmax(self.gate(x), dim=-1)",
      "MoE router: the softmax (and so the top-k) taken in the model dtype, bf16, not float32",
      ("tests/oracle/test_moe_router.py",), ROUTER_CONF),
)


@dataclass
class Outcome:
    caught: bool | None  # None: not run (a GPU-only site on a machine without one, or the column skipped)
    by: list[str]
    seconds: float


@dataclass
class Result:
    mutant: Mutant
    conformance: Outcome
    targeted: Outcome

    @property
    def caught(self) -> bool:
        """The headline: caught by the conformance suite (GPU-only sites: by their targeted tests until run there)."""
        return bool(self.conformance.caught) if self.conformance.caught is not None else bool(self.targeted.caught)


def find(mutants: tuple[Mutant, ...], patterns: list[str]) -> list[Mutant]:
    chosen = [m for m in mutants if not patterns or any(p in m.name for p in patterns)]
    if not chosen:
        raise SystemExit(f"no mutant matches {patterns}; known: {[m.name for m in mutants]}")
    return chosen


def conformance_args(m: Mutant) -> tuple[str, ...] | None:
    """The conformance run of ``m``: None when its site needs a GPU and there is none."""
    if not m.gpu:
        return m.conformance
    import torch

    return (*m.conformance, "-m", "gpu") if torch.cuda.is_available() else None


def run_pytest(root: Path, args: tuple[str, ...], timeout: float) -> tuple[int, str]:
    try:
        done = subprocess.run(pytest_command(args), cwd=root, env=pytest_env(root, interpret=True),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timeout"
    return done.returncode, done.stdout + done.stderr


def outcome(root: Path, name: str, args: tuple[str, ...] | None, timeout: float) -> Outcome:
    if args is None:
        return Outcome(None, [], 0.0)
    t0 = time.perf_counter()
    code, log = run_pytest(root, args, timeout)
    seconds = time.perf_counter() - t0
    if code == 5:  # every test deselected (e.g. a -k of cases this tree does not have yet): nothing caught it
        return Outcome(False, ["(no tests collected)"], seconds)
    if code not in (0, 1, 2, 124) and code > 0:
        raise RuntimeError(f"mutant {name}: pytest exited {code} (usage or internal error):\n{log[-3000:]}")
    by = failing_tests(log)
    if code == 124:
        by = ["(timeout)"]
    elif code < 0:  # killed by a signal (a planted out-of-bounds read segfaults the interpreter): the run is red
        by = [f"(crashed: signal {-code})"]
    elif code and not by:
        by = [f"(pytest exit {code})"]
    return Outcome(code != 0, by, seconds)


def run_mutant(root: Path, m: Mutant, timeout: float = 600, targeted: bool = True) -> Result:
    """Apply ``m`` to the tree at ``root``, run its conformance and targeted tests, restore the file."""
    path = root / m.file
    original = path.read_text()
    check_snippets(root, [m])
    path.write_text(original.replace(m.old, m.new))
    try:
        conf = outcome(root, m.name, conformance_args(m), timeout)
        tgt = outcome(root, m.name, m.tests if targeted else None, timeout)
    finally:
        path.write_text(original)
    return Result(m, conf, tgt)


def baseline(root: Path, mutants: list[Mutant], targeted: bool = True) -> float:
    """Every chosen test on the unmutated copy must pass (otherwise 'caught' would mean nothing)."""
    runs = list(dict.fromkeys(a for m in mutants for a in [conformance_args(m)] if a is not None))
    if targeted:
        runs.append(tuple(dict.fromkeys(t for m in mutants for t in m.tests)))
    t0 = time.perf_counter()
    for args in runs:
        code, log = run_pytest(root, args, 1800)
        if code not in (0, 5):
            raise RuntimeError(f"the unmutated tree fails its own tests ({' '.join(args)}):\n{log[-3000:]}")
    return time.perf_counter() - t0


def _cell(o: Outcome, gpu: bool) -> str:
    if o.caught is None:
        return "GPU only (`-m gpu`)" if gpu else "-"
    by = ", ".join(f"`{b}`" for b in o.by[:2])
    return ("yes" if o.caught else "**NO**") + (f" ({by})" if by else "") + f", {o.seconds:.0f} s"


def table(results: list[Result]) -> str:
    lines = ["| mutant | file | description | caught by `pytest conformance` (CPU) | caught by targeted tests |",
             "| --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r.mutant.name} | `{r.mutant.file}` | {r.mutant.description} | "
                     f"{_cell(r.conformance, r.mutant.gpu)} | {_cell(r.targeted, False)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=[], help="mutant names or substrings")
    p.add_argument("--list", action="store_true", help="list the mutants and their conformance commands, then exit")
    p.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated tree")
    p.add_argument("--conformance-only", action="store_true", help="skip the targeted tests' column")
    gpu = p.add_argument_group("GPU column (tools/mutants_gpu.py): Triton-kernel and gpu=True mutants, -m gpu")
    gpu.add_argument("--gpu", action="store_true", help="run the GPU column instead (needs CUDA)")
    gpu.add_argument("--jobs", type=int, default=8, help="mutants run at once, each in its own tree copy")
    gpu.add_argument("--timeout", type=float, default=300, help="seconds per pytest run")
    gpu.add_argument("--budget", type=float, default=480, help="seconds for the whole GPU run")
    gpu.add_argument("--out", help="folder for table.md and one log per run")
    args = p.parse_args(argv)
    chosen = find(MUTANTS, args.only)
    if args.gpu:
        from . import mutants_gpu

        return mutants_gpu.main(ROOT, chosen, args.jobs, args.timeout, args.budget, args.out, args.list)
    check_snippets(ROOT, chosen)
    if args.list:
        for m in chosen:
            conf = conformance_args(m)
            cmd = " ".join(pytest_command(conf)[1:]) if conf else "GPU only: " + " ".join(m.conformance) + " -m gpu"
            print(f"{m.name:30} {m.file:45} {m.description}\n{'':30} conformance: {cmd}")
        return 0
    targeted = not args.conformance_only
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(ROOT, root, ignore=IGNORE)
        if not args.no_baseline:
            print(f"baseline (unmutated): passed in {baseline(root, chosen, targeted):.0f} s", flush=True)
        results = []
        for m in chosen:
            results.append(run_mutant(root, m, targeted=targeted))
            r = results[-1]
            print(f"{m.name}: conformance {_cell(r.conformance, m.gpu)}; targeted {_cell(r.targeted, False)}",
                  flush=True)
    print(table(results))
    survivors = [r.mutant.name for r in results if not r.caught]
    conf_caught = sum(bool(r.conformance.caught) for r in results)
    gpu_only = sum(r.conformance.caught is None for r in results)
    tgt_caught = sum(bool(r.targeted.caught) for r in results)
    print(f"\nconformance (CPU): {conf_caught}/{len(results)} caught" + (f" ({gpu_only} GPU-only sites not run)"
                                                                       if gpu_only else "") +
          (f"; targeted tests: {tgt_caught}/{len(results)}" if targeted else "") +
          (f"; not caught by conformance: {survivors}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
