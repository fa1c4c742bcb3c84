"""Reference generations to compare against: the stored goldens, or transformers computed live.

A :class:`Reference` bundles the prompts (token ids) with the reference outputs and the settings they were
made with (tokens per prompt, top-k). :func:`golden_reference` reads ``golden/`` (present in a checkout of
this repository); :func:`live_reference` runs :class:`~nanovllm_ref.oracle.adapters.HFAdapter`, the same
arithmetic as the goldens, on any local checkpoint. :func:`run_check` drives an engine adapter over a
reference and returns the :class:`~nanovllm_ref.oracle.compare.ConformanceReport`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .adapters import EngineAdapter, HFAdapter
from .compare import ConformanceReport, EngineOutput, compare_all, ids_from_text
from .tolerances import Tolerance


@dataclass
class Reference:
    """Prompts and reference outputs for one (model, dtype)."""

    model: str  # a short name for reports
    model_path: str
    dtype: str
    prompts: list[list[int]]
    prompt_ids: list[str]
    outputs: list[EngineOutput]
    max_tokens: int = 32
    top_k: int = 20
    source: str = "golden"  # "golden" | "live"
    meta: dict = field(default_factory=dict)

    def subset(self, indices: list[int]) -> Reference:
        """The same reference restricted to some prompts, in the given order."""
        return Reference(self.model, self.model_path, self.dtype, [self.prompts[i] for i in indices],
                         [self.prompt_ids[i] for i in indices], [self.outputs[i] for i in indices],
                         self.max_tokens, self.top_k, self.source, dict(self.meta))


def golden_reference(checkpoint: str, dtype: str) -> Reference:
    """The golden set of a checkpoint in ``golden/checkpoints`` (needs the repository's ``golden`` package)."""
    from golden.load import checkpoint_path, load_golden

    gs = load_golden(checkpoint, dtype)
    outputs = [EngineOutput(o.token_ids, o.topk, o.prompt_logprobs) for o in gs.outputs]
    names = gs.prompt_names or [f"prompt_{i}" for i in range(len(gs.prompts))]
    settings = gs.settings or {}
    return Reference(
        model=checkpoint, model_path=checkpoint_path(checkpoint), dtype=gs.dtype, prompts=gs.prompts,
        prompt_ids=names, outputs=outputs, max_tokens=int(settings.get("num_new_tokens", len(outputs[0].token_ids))),
        top_k=int(settings.get("top_k", max(len(d) for d in outputs[0].topk))), source="golden",
    )


def live_reference(
    model: str, model_path: str, dtype: str, prompts: list[list[int]], prompt_ids: list[str],
    max_tokens: int = 32, top_k: int = 20, measure_noise: bool = True,
) -> Reference:
    """Compute the reference now with :class:`HFAdapter` (transformers, eager, one prompt at a time).

    With ``measure_noise`` the same prompts are also run with sdpa attention, and the largest |dlogprob|
    between the two (as golden/make_goldens.py measures it) goes to ``meta["noise"]`` = {"generated",
    "prompt"}, with the mean over the generated steps' shared top-k logprobs as "mean", from which
    :func:`~nanovllm_ref.oracle.tolerances.noise_tolerance` derives this model's bounds (``mean_tol`` too).
    """
    outputs = _hf_run(model_path, dtype, "eager", prompts, max_tokens, top_k)
    ref = Reference(model, model_path, dtype, [list(p) for p in prompts], list(prompt_ids), outputs,
                    max_tokens, top_k, source="live")
    if measure_noise:
        alt = _hf_run(model_path, dtype, "sdpa", prompts, max_tokens, top_k)
        rep = compare_all(outputs, alt, top_k=top_k, tol=float("inf"), prompt_tol=float("inf"))
        count = sum(p.gen_diff_count for p in rep.prompts)
        ref.meta["noise"] = {"generated": max(p.max_gen_diff for p in rep.prompts),
                             "prompt": max(p.max_prompt_diff for p in rep.prompts),
                             "mean": sum(p.gen_diff_sum for p in rep.prompts) / max(count, 1),
                             "method": "transformers eager vs sdpa, one prompt at a time"}
    return ref


def _hf_run(model_path: str, dtype: str, attn: str, prompts: list[list[int]], max_tokens: int,
            top_k: int) -> list[EngineOutput]:
    hf = HFAdapter(model_path, dtype, attn_implementation=attn)
    try:
        return hf.generate(prompts, max_tokens, top_k, prompt_logprobs=True)
    finally:
        hf.close()


def run_check(
    adapter: EngineAdapter,
    ref: Reference,
    tolerance: Tolerance,
    *,
    case: str = "golden",
    prompt_logprobs: bool = True,
    allow_divergence: bool = True,
    outputs: list[EngineOutput] | None = None,
) -> ConformanceReport:
    """Generate the reference prompts with ``adapter`` (all submitted at once) and compare.

    Pass ``outputs`` to compare already generated outputs instead. ``prompt_logprobs=False`` neither requests
    nor compares prompt logprobs (e.g. to let a prefix cache serve the prompts). An adapter whose
    ``returns_logprobs`` is False (read after generating: a server may only tell then) is compared in the
    policy's tokens-only mode (compare.py); one whose ``returns_prompt_logprobs`` is False without prompt logprobs.
    """
    prompt_logprobs = prompt_logprobs and getattr(adapter, "returns_prompt_logprobs", True)
    if outputs is None:
        outputs = adapter.generate(ref.prompts, ref.max_tokens, ref.top_k, prompt_logprobs)
    tokens_only = getattr(adapter, "returns_logprobs", True) is False
    if tokens_only and any(o.text is not None and not o.token_ids for o in outputs):
        decode = adapter.decode  # an adapter answering text has the checkpoint's tokenizer
        outputs = [EngineOutput(ids_from_text(o.text, r, decode, ref.top_k), [], None, o.num_cached_tokens, o.text)
                   if o.text is not None and not o.token_ids else o for r, o in zip(ref.outputs, outputs)]
    return compare_all(
        ref.outputs, outputs, top_k=ref.top_k, tol=tolerance.tol,
        prompt_tol=tolerance.prompt_tol if prompt_logprobs else None, prompt_ids=ref.prompt_ids,
        allow_divergence=allow_divergence, prompts=ref.prompts, model=ref.model, dtype=ref.dtype,
        engine=getattr(adapter, "name", type(adapter).__name__), case=case,
        meta={"reference": ref.source, "tolerance": tolerance.as_dict(),
              "mode": "tokens-only" if tokens_only else "logprobs", "prompt_logprobs": prompt_logprobs},
        tokens_only=tokens_only, mean_tol=tolerance.mean_tol, divergence_by_value=tolerance.divergence_by_value,
        position_tol=tolerance.position_tol,
    )
