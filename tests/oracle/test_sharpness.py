"""Sharpness of the conformance policy: realistic bugs injected into nanovllm_ref by
monkeypatching must make the golden comparison FAIL, and the unmodified engine must PASS, with the same
library code and tolerances as conformance/ (nanovllm_ref.oracle: compare_all, golden_tolerance, run_check).

One golden checkpoint in float32. Each bug runs in the engine setting that exercises it: "plain" (all prompts
at once, prompt logprobs), "warm" (a second pass over a warm prefix cache; prompt logprobs are not requested
there since they bypass the cache) or "preempt" (a KV cache barely larger than the longest request).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.compare import ConformanceReport
from nanovllm_ref.oracle.references import Reference, golden_reference, run_check
from nanovllm_ref.oracle.tolerances import golden_tolerance

golden_load = pytest.importorskip("golden.load")
DTYPE = "float32"
BLOCK = 16


def _pick_checkpoint() -> str | None:
    """The golden checkpoint with the largest grouped-query-attention group (> 1 KV head), else the first."""
    names = [n for n in golden_load.list_checkpoints() if golden_load.output_paths(n, DTYPE)[0].is_file()]
    best, best_group = (names[0] if names else None), 1
    for n in names:
        cfg = json.loads((Path(golden_load.checkpoint_path(n)) / "config.json").read_text())
        group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
        if cfg["num_key_value_heads"] > 1 and group > best_group:
            best, best_group = n, group
    return best


CHECKPOINT = _pick_checkpoint()
pytestmark = pytest.mark.skipif(CHECKPOINT is None, reason="no float32 goldens in golden/outputs")


@pytest.fixture(scope="module")
def ref() -> Reference:
    return golden_reference(CHECKPOINT, DTYPE)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: more threads only add contention on a loaded machine
    yield
    torch.set_num_threads(old)


def run(ref: Reference, setting: str, post: Callable[[NanovllmRefAdapter], None] | None = None) -> ConformanceReport:
    # the attention bugs below are planted in the torch reference backend, so the engine must run on it
    kwargs: dict = {"kvcache_block_size": BLOCK, "attention_backend": "torch"}
    if setting == "preempt":
        longest = max(map(len, ref.prompts)) + ref.max_tokens
        kwargs.update(num_kvcache_blocks=-(-longest // BLOCK) + 2, max_model_len=longest)
    adapter = NanovllmRefAdapter(ref.model_path, DTYPE, **kwargs)
    try:
        if post is not None:
            post(adapter)
        if setting == "warm":
            adapter.generate(ref.prompts, ref.max_tokens, ref.top_k, prompt_logprobs=False)
            outputs = adapter.generate(ref.prompts, ref.max_tokens, ref.top_k, prompt_logprobs=False)
            assert any(o.num_cached_tokens for o in outputs), "the second pass should hit the prefix cache"
        else:
            outputs = adapter.generate(ref.prompts, ref.max_tokens, ref.top_k, prompt_logprobs=True)
        if setting == "preempt":
            assert adapter.num_preemptions > 0
    finally:
        adapter.close()
    return run_check(adapter, ref, golden_tolerance(DTYPE), case=setting, outputs=outputs,
                     prompt_logprobs=setting != "warm")


# ---- the bugs ----------------------------------------------------------------------------------------------
def _patch_prepare_step(mp: pytest.MonkeyPatch, edit: Callable) -> None:
    """Wrap the engine's prepare_step; ``edit(step, out, block_size)`` corrupts the StepInput."""
    import nanovllm_ref.engine.llm_engine as le

    orig = le.prepare_step

    def buggy(out, block_size):
        step = orig(out, block_size)
        edit(step, out, block_size)
        return step

    mp.setattr(le, "prepare_step", buggy)


def rope_cached_prefix(mp):
    """RoPE positions off by one for a prefill that starts after a cached prefix (num_computed > 0)."""
    def edit(step, out, bs):
        row = 0
        for seq, n in out.scheduled:
            if seq.num_computed_tokens > 0 and n > 1:
                for r in range(row, row + n):
                    step.positions[r] += 1
            row += n
    _patch_prepare_step(mp, edit)


def slot_off_by_one(mp):
    """KV written one slot off inside its block: slot = block * bs + (p + 1) % bs."""
    def edit(step, out, bs):
        step.slot_mapping = [s - s % bs + (s % bs + 1) % bs for s in step.slot_mapping]
    _patch_prepare_step(mp, edit)


def prompt_logprobs_shifted(mp):
    """Prompt logprobs reported against the token at the same position instead of the next one."""
    def edit(step, out, bs):
        step.prompt_logprobs = [(sid, rows, [targets[0], *targets[:-1]], k)
                                for sid, rows, targets, k in step.prompt_logprobs]
    _patch_prepare_step(mp, edit)


def _reference_attention(expand: str = "repeat_interleave", scale_factor: float = 1.0, lookahead: int = 0):
    from nanovllm_ref.kernels.prefill_attention import gather_kv

    def attention(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, kv_scales=None):
        assert kv_scales is None, "the injected bugs run on a model-dtype KV cache"
        out = torch.empty_like(q)
        group = q.shape[1] // k_cache.shape[2]

        def heads(cache, s, seq_len):  # (seq_len, num_heads, head_dim), KV heads expanded to the query heads
            kv = gather_kv(cache, block_tables[s], seq_len).float()
            return kv.repeat(1, group, 1) if expand == "repeat" else kv.repeat_interleave(group, dim=1)

        starts, lens = query_start_loc.tolist(), seq_lens.tolist()
        for s, seq_len in enumerate(lens):
            q0, q1 = starts[s], starts[s + 1]
            k, v = heads(k_cache, s, seq_len), heads(v_cache, s, seq_len)
            scores = torch.einsum("qhd,khd->hqk", q[q0:q1].float(), k) * (scale * scale_factor)
            q_pos = torch.arange(seq_len - (q1 - q0), seq_len)
            mask = torch.arange(seq_len)[None, None, :] > q_pos[None, :, None] + lookahead
            probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
            out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
        return out

    return attention


def _patch_attention(mp, **kwargs):
    import nanovllm_ref.attention.torch_backend as tb

    mp.setattr(tb, "prefill_attention_reference", _reference_attention(**kwargs))


def gqa_repeat(mp):
    """GQA: KV heads tiled (repeat) instead of interleaved (repeat_interleave) across the query heads."""
    _patch_attention(mp, expand="repeat")


def softmax_scale(mp):
    """Attention softmax scale 5% too large."""
    _patch_attention(mp, scale_factor=1.05)


def causal_mask_off_by_one(mp):
    """The causal mask lets each prompt token see the next one."""
    _patch_attention(mp, lookahead=1)


def rmsnorm_eps(mp):
    """RMSNorm with eps 1e-5 (a common default) instead of the checkpoint's rms_norm_eps."""
    import nanovllm_ref.layers.norm as norm

    orig = norm.rms_norm_reference
    mp.setattr(norm, "rms_norm_reference", lambda x, w, eps, residual=None: orig(x, w, 1e-5, residual))


def residual_dropped(mp):
    """The last decoder layer drops the residual around attention."""
    def post(adapter):
        layer = adapter.llm.engine.runner.model.model.layers[-1]

        def forward(positions, x, residual):
            x, residual = layer.input_layernorm(x, residual) if residual is not None else (
                layer.input_layernorm(x), x)
            x = layer.self_attn(positions, x)
            residual = x  # BUG: should be x + residual
            return layer.mlp(layer.post_attention_layernorm(x)), residual
        layer.forward = forward
    return post


def stale_block_table(mp):
    """Preemption frees a sequence's blocks but keeps its old block table, reused when it comes back."""
    from nanovllm_ref.engine.scheduler import Scheduler

    orig = Scheduler._preempt

    def buggy(self, seq):
        table = seq.block_table[:]  # (a copy, of the same type)
        orig(self, seq)
        seq.block_table = table
    mp.setattr(Scheduler, "_preempt", buggy)


def final_norm_dropped(mp):
    """The final RMSNorm before the LM head is skipped (the residual is still added)."""
    def post(adapter):
        norm = adapter.llm.engine.runner.model.model.norm
        norm.forward = lambda x, residual=None: (x + residual, x + residual) if residual is not None else x
    return post


BUGS = {
    "rope_cached_prefix": ("warm", rope_cached_prefix),
    "slot_off_by_one": ("plain", slot_off_by_one),
    "prompt_logprobs_shifted": ("plain", prompt_logprobs_shifted),
    "gqa_repeat": ("plain", gqa_repeat),
    "softmax_scale": ("plain", softmax_scale),
    "causal_mask_off_by_one": ("plain", causal_mask_off_by_one),
    "rmsnorm_eps": ("plain", rmsnorm_eps),
    "residual_dropped": ("plain", residual_dropped),
    "stale_block_table": ("preempt", stale_block_table),
    "final_norm_dropped": ("plain", final_norm_dropped),
}


@pytest.mark.parametrize("setting", ["plain", "warm", "preempt"])
def test_unmodified_engine_passes(ref, setting) -> None:
    report = run(ref, setting)
    assert report.passed, "\n" + report.format_failures()


@pytest.mark.parametrize("bug", list(BUGS))
def test_injected_bug_fails(ref, bug, monkeypatch) -> None:
    setting, inject = BUGS[bug]
    post = inject(monkeypatch)
    try:
        report = run(ref, setting, post)
    except (RuntimeError, IndexError) as exc:  # a crash is caught too, but the report should catch it first
        pytest.fail(f"bug {bug!r} crashed the engine instead of producing a failing report: {exc}")
    assert not report.passed, f"bug {bug!r} ({inject.__doc__}) went unnoticed:\n{report.summary_table('model')}"
    print(f"{bug}: {len(report.failures())}/{len(report.prompts)} prompts fail; first: "
          f"{report.failures()[0].message}")
