"""Shared pieces of the conformance suite: model selection, engine and reference pools, tolerances."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nanovllm_ref.oracle.adapters import EngineAdapter, load_adapter
from nanovllm_ref.oracle.compare import EngineOutput
from nanovllm_ref.oracle.dialects import DIALECTS, legacy_view, split_dialect
from nanovllm_ref.oracle.references import Reference, golden_reference, live_reference
from nanovllm_ref.oracle.tolerances import Tolerance, golden_tolerance, noise_tolerance, quantized_tolerance


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str
    golden: bool  # a checkpoint of golden/checkpoints (goldens available)


@dataclass(frozen=True)
class Options:
    engine: str
    reference: str
    tp: int
    tol: float | None
    prompt_tol: float | None
    engine_args: tuple[tuple[str, Any], ...] = ()  # --engine-arg KEY=VALUE, for the engine's factory


def selected_models(config: pytest.Config) -> list[ModelSpec]:
    from golden.load import CHECKPOINTS_DIR, checkpoint_path, list_checkpoints

    raw = config.getoption("--model")
    raw = [raw] if isinstance(raw, str) else list(raw or [])  # a str if a plugin loaded earlier owns --model
    names = [m.strip() for opt in raw for m in opt.split(",") if m.strip()]
    if not names:
        return [ModelSpec(n, checkpoint_path(n), True) for n in list_checkpoints()]
    specs = []
    for n in names:
        if os.path.isdir(n) and Path(n).resolve().parent == CHECKPOINTS_DIR.resolve():
            n = Path(n).resolve().name  # a golden checkpoint given by its path
        base, dialect = split_dialect(n)
        if base in list_checkpoints() and dialect != DIALECTS[0]:  # the same checkpoint in another config dialect
            specs.append(ModelSpec(n, legacy_view(checkpoint_path(base)), True))
        elif n in list_checkpoints():
            specs.append(ModelSpec(n, checkpoint_path(n), True))
        elif os.path.isdir(n):
            path = os.path.abspath(n)
            specs.append(ModelSpec(os.path.basename(path.rstrip("/")), path, False))
        else:
            raise pytest.UsageError(f"--model {n!r} is neither a golden checkpoint ({list_checkpoints()}) "
                                    "nor a checkpoint folder")
    return specs


def tolerance_for(dtype: str, options: Options, ref: Reference | None = None,
                  quantization: str | None = None) -> Tolerance:
    """The golden tolerance; for a live reference, the one derived from the noise measured on that model
    (transformers eager vs sdpa); for an engine running quantized weights (its adapter's ``quantization``), that
    quantization's tier (tolerances.QUANT_TIERS); --tol / --prompt-tol override any."""
    noise = ref.meta.get("noise") if ref is not None else None
    if quantization is not None:
        tol = quantized_tolerance(quantization, dtype, split_dialect(ref.model)[0] if ref is not None else None)
    elif noise:
        tol = noise_tolerance(dtype, noise["generated"], noise["prompt"], f"live: {noise['method']}")
    else:
        tol = golden_tolerance(dtype, checkpoint=split_dialect(ref.model)[0] if ref is not None else None)
    return tol.override(options.tol, options.prompt_tol)


class EnginePool:
    """Engines built once per (engine, model, dtype, settings) and reused; only one is alive at a time (building
    another closes it first: an external engine holds processes and memory), and outputs are memoized."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.adapters: dict[tuple, EngineAdapter] = {}
        self.outputs: dict[tuple, list[EngineOutput]] = {}

    def engine_kwargs(self, **extra: Any) -> dict[str, Any]:
        """--engine-arg settings, then ``extra``, plus --tp for nanovllm_ref (``tensor_parallel_size=1`` is the
        default, so left out)."""
        if self.options.engine != "nanovllm_ref":
            return {**dict(self.options.engine_args), **extra}
        kwargs = {"tensor_parallel_size": self.options.tp, **dict(self.options.engine_args), **extra}
        if kwargs["tensor_parallel_size"] == 1:
            del kwargs["tensor_parallel_size"]
        return kwargs

    def get(self, model: ModelSpec, dtype: str, **extra: Any) -> EngineAdapter:
        kwargs = self.engine_kwargs(**extra)
        key = (self.options.engine, model.path, dtype, tuple(sorted(kwargs.items())))
        if key not in self.adapters:
            self.close()
            self.adapters[key] = load_adapter(self.options.engine, model.path, dtype, **kwargs)
        return self.adapters[key]

    def generate(self, model: ModelSpec, dtype: str, ref: Reference, **extra: Any) -> list[EngineOutput]:
        """The engine's outputs for all reference prompts submitted at once (memoized)."""
        key = (model.path, dtype, tuple(sorted(self.engine_kwargs(**extra).items())))
        if key not in self.outputs:
            adapter = self.get(model, dtype, **extra)
            self.outputs[key] = adapter.generate(ref.prompts, ref.max_tokens, ref.top_k, prompt_logprobs=True)
        return self.outputs[key]

    def close(self) -> None:
        for adapter in self.adapters.values():
            adapter.close()
        self.adapters.clear()


class ReferencePool:
    """Golden or live references per (model, dtype), loaded or computed once."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.cache: dict[tuple, Reference] = {}

    def get(self, model: ModelSpec, dtype: str) -> Reference:
        key = (model.path, dtype)
        if key not in self.cache:
            self.cache[key] = self._make(model, dtype)
        return self.cache[key]

    def _make(self, model: ModelSpec, dtype: str) -> Reference:
        if self.options.reference == "golden":
            if not model.golden:
                pytest.skip(f"{model.path} has no goldens: use --reference live")
            ref = golden_reference(split_dialect(model.name)[0], dtype)  # a dialect view has its checkpoint's
            ref.model, ref.model_path = model.name, model.path
            return ref
        prompts, names = live_prompts(model.path)
        return live_reference(model.name, model.path, dtype, prompts, names)


def live_prompts(model_path: str) -> tuple[list[list[int]], list[str]]:
    """The golden prompt set (token ids taken modulo the model's vocabulary), for live references."""
    from golden.load import list_checkpoints

    vocab = json.loads((Path(model_path) / "config.json").read_text())["vocab_size"]
    ref = golden_reference(list_checkpoints()[0], "float32")
    return [[t % vocab for t in p] for p in ref.prompts], ref.prompt_ids




# Which invariance cases run on which golden checkpoint in the default sweep (no --model), keeping
# `nox -s conformance` under ~10 minutes on 2 CPU cores: every checkpoint runs test_golden in every dtype; the
# head_dim 32 / 64 checkpoints run the invariance cases their own code paths need (TP=2 wherever a row-parallel
# bias or the MoE all-reduce is), the other checkpoints run them all. Naming checkpoints with --model, or a model
# not listed here, runs every case. Keys: test names of test_invariance.py (parametrized ones with their id).
INVARIANCE_CASES: dict[str, tuple[str, ...]] = {
    # o_proj and down_proj biases: added once after the all-reduce, not once per rank
    "llama3-bias-hd32": ("test_tensor_parallel", "test_engine_setting[chunked-prefill-7]"),
    # unnormalized router at TP=2 (replicated router, split experts, one all-reduce; o_proj bias); routing per token
    # must not depend on the batch
    "qwen3-moe-unnorm-hd32": ("test_tensor_parallel", "test_alone_vs_batched"),
    # Qwen3 attention_bias (o_proj bias) at TP=2 with hidden states in the hundreds
    "qwen3-bias-hd32": ("test_tensor_parallel",),
    # head_dim 64 through the paged paths: prefix cache, 256-token blocks, preemption
    "qwen3-tied-hd64": ("test_prefix_cache_cold_vs_warm",),
    "qwen2-hd64": ("test_engine_setting[block-size-256]", "test_forced_preemption"),
    "mistral-hd64": ("test_alone_vs_batched",),
}


def deselect_invariance_cases(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the invariance cases that :data:`INVARIANCE_CASES` does not choose for a checkpoint (default sweep only)."""
    if config.getoption("--model"):
        return
    keep, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        spec = callspec.params.get("model_spec") if callspec else None
        chosen = INVARIANCE_CASES.get(spec.name) if isinstance(spec, ModelSpec) else None
        if chosen is None or Path(str(item.path)).name != "test_invariance.py" or _is_chosen(item, chosen):
            keep.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _is_chosen(item: pytest.Item, chosen: tuple[str, ...]) -> bool:
    """``"test_x"`` chooses every parametrization of test_x; ``"test_x[setting-id]"`` only the one with that id."""
    for case in chosen:
        name, _, setting = case.partition("[")
        if name == item.originalname and (not setting or setting.rstrip("]") in item.callspec.id):
            return True
    return False
