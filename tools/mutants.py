"""Mutation testing: realistic bugs planted one at a time in a copy of the repo; the tests must catch each.

Each mutant replaces one exact snippet of the source (the snippet must occur exactly once, or the run stops
with an error before anything runs: the list cannot rot silently) in a temporary copy of the tree
(``shutil.copytree``; the working tree is never touched), then runs the tests chosen for it: pytest exit status
1 or 2 (failures or collection errors) means caught, 0 means the mutant survived. The file is restored before
the next mutant. A baseline run of every chosen test on the unmutated copy must pass first.

    python -m tools.mutants                 # all; prints a markdown table, exits 1 if any mutant survived
    python -m tools.mutants --only top-k    # some (names or substrings); --list shows them
    nox -s mutants
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", ".nox", ".venv", ".whl", "build", "dist", "*.egg-info", "__pycache__",
                                ".pytest_cache", ".hypothesis", ".benchmarks", ".ruff_cache", "examples")
# conformance options (global, from the plugin): the golden test on one checkpoint in float32 (~3 s of tests)
OPTIONS = ("--model", "qwen3-tiny", "--dtype", "float32", "--report", os.devnull)
GOLDEN = "conformance/test_golden.py::test_golden"
KERNEL_ATTN = "tests/kernels/test_kernel_attention.py::test_prefill_attention"
SDPA_ORACLE = "tests/test_sdpa_backend.py"  # the sdpa backend (the CPU default) against the torch reference
RMS = "tests/kernels/test_kernel_norm_rotary.py::test_rms_norm"
ROT = "tests/kernels/test_kernel_norm_rotary.py::test_apply_rotary"
BLOCKS, SCHED = "tests/properties/test_block_manager_props.py", "tests/properties/test_scheduler_props.py"
SAMPLING = "tests/test_sampling.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    description: str
    tests: tuple[str, ...]  # test files / node ids, run in this order, stopping at the first failure


M = Mutant
MUTANTS: tuple[Mutant, ...] = (
    M("rmsnorm-kernel-mean", "nanovllm_ref/kernels/rmsnorm.py", "var = tl.sum(h * h, 0) / hidden",
      "var = tl.sum(h * h, 0) / BLOCK", "Triton RMSNorm averages over the padded block, not the hidden size",
      (RMS,)),
    M("rotary-kernel-sign", "nanovllm_ref/kernels/rotary.py", "b1 = (-x2 * sin[None, :])",
      "b1 = (x2 * sin[None, :])", "Triton RoPE: rotate-half without the minus sign", (ROT,)),
    M("attention-kernel-causal", "nanovllm_ref/kernels/_triton_common.py",
      "s = tl.where(offs_n[None, :] < row_end[:, None], s", "s = tl.where(offs_n[None, :] <= row_end[:, None], s",
      "Triton paged attention: the causal mask lets a query see one key too many", (KERNEL_ATTN,)),
    M("store-kv-kernel-slot0", "nanovllm_ref/kernels/store_kv.py", "if slot < 0:  # padding token",
      "if slot <= 0:  # padding token", "Triton KV store skips slot 0 as if it were padding",
      ("tests/kernels/test_kernel_store_kv.py",)),
    M("rmsnorm-eps", "nanovllm_ref/kernels/rmsnorm.py", "h.pow(2).mean(dim=-1, keepdim=True) + eps)",
      "h.pow(2).mean(dim=-1, keepdim=True) + 1e-5)", "RMSNorm reference uses eps 1e-5, not the config's",
      (RMS, GOLDEN)),
    M("rotary-reference-sign", "nanovllm_ref/kernels/rotary.py", "rotated = torch.cat([-x2, x1], dim=-1)",
      "rotated = torch.cat([x2, -x1], dim=-1)", "RoPE reference rotates the wrong way (rotate_half sign)",
      (GOLDEN,)),
    M("attention-scale", "nanovllm_ref/models/qwen3.py", "scale = self.head_dim**-0.5", "scale = self.head_dim**-1",
      "attention scale 1/d instead of 1/sqrt(d)", (GOLDEN,)),
    M("attention-causal-reference", "nanovllm_ref/kernels/prefill_attention.py",
      "q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)",
      "q_pos = torch.arange(seq_len - q_len + 1, seq_len + 1, device=q.device)",
      "reference attention: query positions off by one (a token sees the next one)", (SDPA_ORACLE,)),
    M("sdpa-causal", "nanovllm_ref/attention/sdpa_backend.py",
      "(key_pos[None, None, :] <= query_pos[:, :, None])", "(key_pos[None, None, :] <= query_pos[:, :, None] + 1)",
      "sdpa backend (the CPU default): a query after a cached prefix sees the next token", (SDPA_ORACLE,)),
    M("sdpa-fresh-not-causal", "nanovllm_ref/attention/sdpa_backend.py", "v[:, :, :n], is_causal=True,",
      "v[:, :, :n], is_causal=False,", "sdpa backend: a batch of fresh prompts attends without the causal mask",
      (GOLDEN,)),
    M("sdpa-gqa-tiled", "nanovllm_ref/attention/sdpa_backend.py",
      "queries = q.float().reshape(num_seqs, self.num_kv_heads, -1, self.head_dim)",
      "queries = q.float().reshape(num_seqs, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)",
      "sdpa backend decode: query heads tiled over the KV heads instead of grouped", (GOLDEN,)),
    M("sdpa-reads-past-context", "nanovllm_ref/attention/sdpa_backend.py",
      "torch.where(key_pos < seq_lens[:, None], slots, slots[:, :1])", "slots",
      "sdpa backend: masked keys past the context read the cache there (a freed block's NaN poisons the sum)",
      (SDPA_ORACLE,)),
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
    M("decode-batch-length", "nanovllm_ref/engine/decode_batch.py",
      "np.flatnonzero(self.finish_t <= t)", "np.flatnonzero(self.finish_t < t)",
      "vectorized decode step finishes a request one token late", ("tests/properties/test_decode_batch.py",)),
    M("decode-batch-slot", "nanovllm_ref/engine/decode_batch.py",
      "slots[r] = tables[r][p // bs] * bs - t", "slots[r] = tables[r][p // bs - 1] * bs - t",
      "vectorized decode step keeps writing into the previous block after a block boundary",
      ("tests/properties/test_decode_batch.py",)),
    M("async-stale-rows", "nanovllm_ref/engine/llm_engine.py",
      "keep = [i for i, (seq, _) in enumerate(out.scheduled) if not seq.is_finished]", "keep = None",
      "async scheduling feeds the step behind one whose rows finished the wrong rows' tokens",
      ("tests/test_async_scheduling.py",)),
    M("async-apply-to-wrong-rows", "nanovllm_ref/engine/scheduler.py", "if len(scheduled) != len(batch.seqs):",
      "if False:", "async scheduling applies a step's tokens to the wrong rows after a row finished in flight",
      ("tests/test_async_scheduling.py",)),
    M("flash-attn-not-causal", "nanovllm_ref/attention/flash_attn_backend.py",
      "causal=True, block_table=meta.block_tables", "causal=False, block_table=meta.block_tables",
      "flash-attn backend: prefill without the causal mask", ("tests/test_flash_attn_backend.py",)),
    M("top-k-off-by-one", "nanovllm_ref/layers/sampler.py", "drop = rank >= k", "drop = rank > k",
      "top-k keeps k + 1 tokens", (f"{SAMPLING}::test_top_k_restricts_support_and_renormalizes",)),
    M("top-p-nucleus", "nanovllm_ref/layers/sampler.py", "mass_before = probs.cumsum(dim=-1) - probs",
      "mass_before = probs.cumsum(dim=-1)", "top-p drops the token that crosses p",
      (f"{SAMPLING}::test_top_p_keeps_the_smallest_nucleus",)),
    M("temperature-multiplies", "nanovllm_ref/kernels/sampling.py",
      "scores = logits / torch.where(temperature > 0", "scores = logits * torch.where(temperature > 0",
      "sampling multiplies the logits by the temperature", (f"{SAMPLING}::test_temperature_distribution",)),
    M("seed-position-ignored", "nanovllm_ref/kernels/sampling.py",
      "return pcg_hash((pcg_hash((seeds ^ (seeds >> 32)) & _M32) + counters) & _M32)",
      "return pcg_hash((pcg_hash((seeds ^ (seeds >> 32)) & _M32)) & _M32)",
      "seeded noise ignores the token position (every step draws the same noise)", (SAMPLING,)),
    M("kernel-key-ignores-position", "nanovllm_ref/kernels/sampling.py",
      "+ tl.load(counters_ptr + row).to(tl.uint32))", ")",
      "the Triton sampler's row key ignores the token position",
      (f"{SAMPLING}::test_gumbel_kernel_matches_reference",)),
    M("kernel-nan-row-unflagged", "nanovllm_ref/kernels/sampling.py",
      "finite &= (x == x)", "finite |= (x == x)", "the Triton sampler does not flag a row of NaN/inf logits",
      (f"{SAMPLING}::test_gumbel_kernel_matches_reference",)),
    M("loader-kv-swap", "nanovllm_ref/layers/linear.py", 'offset = q_size if shard_id == "k" else q_size + kv_size',
      'offset = q_size + kv_size if shard_id == "k" else q_size', "loader swaps the k and v shards of qkv_proj",
      (GOLDEN,)),
)


@dataclass
class Result:
    mutant: Mutant
    caught: bool
    by: list[str]
    seconds: float


def find(mutants: tuple[Mutant, ...], patterns: list[str]) -> list[Mutant]:
    chosen = [m for m in mutants if not patterns or any(p in m.name for p in patterns)]
    if not chosen:
        raise SystemExit(f"no mutant matches {patterns}; known: {[m.name for m in mutants]}")
    return chosen


def check_snippets(root: Path, mutants: list[Mutant]) -> None:
    """Raise ValueError unless every mutant's snippet occurs exactly once in its file under ``root``."""
    for m in mutants:
        text = (root / m.file).read_text()
        if text.count(m.old) != 1:
            raise ValueError(f"mutant {m.name!r}: the snippet {m.old!r} occurs {text.count(m.old)} times in "
                             f"{m.file} (expected exactly once): update tools/mutants.py")


def run_pytest(root: Path, args: tuple[str, ...], timeout: float) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", "TRITON_INTERPRET": "1",
           "HYPOTHESIS_PROFILE": "mutants", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *OPTIONS, *args]
    try:
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timeout"
    return done.returncode, done.stdout + done.stderr


def run_mutant(root: Path, m: Mutant, timeout: float = 600) -> Result:
    """Apply ``m`` to the tree at ``root``, run its tests, restore the file."""
    path = root / m.file
    original = path.read_text()
    check_snippets(root, [m])
    path.write_text(original.replace(m.old, m.new))
    t0 = time.perf_counter()
    try:
        code, log = run_pytest(root, m.tests, timeout)
    finally:
        path.write_text(original)
    seconds = time.perf_counter() - t0
    if code not in (0, 1, 2, 124):
        raise RuntimeError(f"mutant {m.name}: pytest exited {code} (usage or internal error):\n{log[-3000:]}")
    by = re.findall(r"^(?:FAILED|ERROR) (\S+)", log, flags=re.M)
    if code == 124:
        by = ["(timeout)"]
    elif code and not by:
        by = [f"(pytest exit {code})"]
    return Result(m, code != 0, by, seconds)


def baseline(root: Path, mutants: list[Mutant]) -> float:
    """Every chosen test on the unmutated copy must pass (otherwise 'caught' would mean nothing)."""
    args = list(dict.fromkeys(t for m in mutants for t in m.tests))
    t0 = time.perf_counter()
    code, log = run_pytest(root, tuple(args), 1800)
    if code != 0:
        raise RuntimeError(f"the unmutated tree fails its own tests ({' '.join(args)}):\n{log[-3000:]}")
    return time.perf_counter() - t0


def table(results: list[Result]) -> str:
    lines = ["| mutant | file | description | caught | by | seconds |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        by = ", ".join(f"`{b}`" for b in r.by[:3]) or "-"
        lines.append(f"| {r.mutant.name} | `{r.mutant.file}` | {r.mutant.description} | "
                     f"{'yes' if r.caught else '**NO**'} | {by} | {r.seconds:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=[], help="mutant names or substrings")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated tree")
    args = p.parse_args(argv)
    chosen = find(MUTANTS, args.only)
    check_snippets(ROOT, chosen)
    if args.list:
        for m in chosen:
            print(f"{m.name:28} {m.file:45} {m.description}")
        return 0
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(ROOT, root, ignore=IGNORE)
        if not args.no_baseline:
            print(f"baseline (unmutated): passed in {baseline(root, chosen):.0f} s", flush=True)
        results = []
        for m in chosen:
            results.append(run_mutant(root, m))
            r = results[-1]
            print(f"{m.name}: {'caught' if r.caught else 'SURVIVED'} ({r.seconds:.0f} s)", flush=True)
    print(table(results))
    survivors = [r.mutant.name for r in results if not r.caught]
    print(f"\n{len(results) - len(survivors)}/{len(results)} mutants caught" +
          (f"; survived: {survivors}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
