"""Shared pieces of the conformance suite: model selection, engine and reference pools, tolerances."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from nanovllm_ref.oracle.adapters import EngineAdapter, load_adapter
from nanovllm_ref.oracle.compare import EngineOutput
from nanovllm_ref.oracle.dialects import DIALECTS, legacy_view, split_dialect
from nanovllm_ref.oracle.references import Reference, golden_reference, live_reference
from nanovllm_ref.oracle.spec_decode import SpecConfig, configs_for
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


def selected_dtypes(config: pytest.Config) -> list[str]:
    """--dtype's dtypes, in order."""
    return [d.strip() for d in config.getoption("--dtype").split(",") if d.strip()]


def require_dtype(config: pytest.Config, dtype: str) -> None:
    """Skip a case that runs in ``dtype`` whatever the parametrization when --dtype does not include it (a
    ``--dtype float32`` run runs no bfloat16 case)."""
    if dtype not in selected_dtypes(config):
        pytest.skip(f"--dtype {config.getoption('--dtype')}: this case runs in {dtype} (add it to --dtype)")


def selected_models(config: pytest.Config) -> list[ModelSpec]:
    from golden.load import checkpoint_path, golden_name, list_checkpoints, resolve_model

    raw = config.getoption("--model")
    raw = [raw] if isinstance(raw, str) else list(raw or [])  # a str if a plugin loaded earlier owns --model
    names = [m.strip() for opt in raw for m in opt.split(",") if m.strip()]
    if not names:
        return [ModelSpec(n, checkpoint_path(n), True) for n in list_checkpoints()]
    specs = []
    for n in names:
        base, dialect = split_dialect(n)
        if base in list_checkpoints() and dialect != DIALECTS[0]:  # the same checkpoint in another config dialect
            specs.append(ModelSpec(n, legacy_view(checkpoint_path(base)), True))
            continue
        try:
            path = os.path.abspath(resolve_model(n))  # the resolver the CLI and the adapters use
        except ValueError as e:
            raise pytest.UsageError(f"--model: {e}") from None
        golden = golden_name(path)  # a golden checkpoint, by name or by its folder
        specs.append(ModelSpec(golden or os.path.basename(path.rstrip("/")), path, golden is not None))
    return specs


def tolerance_for(dtype: str, options: Options, ref: Reference | None = None,
                  quantization: str | None = None) -> Tolerance:
    """The golden tolerance; for a live reference, the one derived from the noise measured on that model
    (transformers eager vs sdpa; its mean bounds the set's mean, mean_tol, as for the goldens); for an engine
    running quantized weights (its adapter's ``quantization``), that quantization's tier (tolerances.QUANT_TIERS);
    --tol / --prompt-tol override any."""
    noise = ref.meta.get("noise") if ref is not None else None
    if quantization is not None:
        tol = quantized_tolerance(quantization, dtype, split_dialect(ref.model)[0] if ref is not None else None)
    elif noise:
        tol = noise_tolerance(dtype, noise["generated"], noise["prompt"], f"live: {noise['method']}",
                              noise.get("mean"))
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
        self.failed: dict[tuple, str] = {}  # engines that could not be built: said once in full, then in one line

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
        key = (self.options.engine, model.path, dtype, settings_key(kwargs))
        if key in self.failed:
            pytest.fail(f"the engine could not be built (its first test shows why): {self.failed[key]}", pytrace=False)
        if key not in self.adapters:
            self.close()
            try:
                self.adapters[key] = load_adapter(self.options.engine, model.path, dtype, **kwargs)
            except Exception as e:
                self.failed[key] = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
                raise
        return self.adapters[key]

    def generate(self, model: ModelSpec, dtype: str, ref: Reference, **extra: Any) -> list[EngineOutput]:
        """The engine's outputs for all reference prompts submitted at once (memoized)."""
        key = (model.path, dtype, settings_key(self.engine_kwargs(**extra)))
        if key not in self.outputs:
            adapter = self.get(model, dtype, **extra)
            self.outputs[key] = adapter.generate(ref.prompts, ref.max_tokens, ref.top_k, prompt_logprobs=True)
        return self.outputs[key]

    def close(self) -> None:
        for adapter in self.adapters.values():
            adapter.close()
        self.adapters.clear()


def settings_key(settings: dict[str, Any]) -> tuple:
    """A hashable key of engine settings whose values may be dicts or lists (a speculative_config)."""
    return tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in settings.items()))


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

    def prompts(self, model: ModelSpec, dtype: str) -> Reference:
        """The reference where there is one; with ``--reference none`` the prompts alone (the golden prompt set,
        no outputs), for the reference-free modules: nothing is computed with transformers."""
        if self.options.reference != "none":
            return self.get(model, dtype)
        if model.golden:
            return replace(golden_reference(model.name, dtype), outputs=[], source="none")
        prompts, names = live_prompts(model.path)
        return Reference(model.name, model.path, dtype, prompts, names, [], source="none")

    def _make(self, model: ModelSpec, dtype: str) -> Reference:
        if self.options.reference == "none":
            pytest.skip("--reference none: this check compares with a reference; only the reference-free modules "
                        "run (test_self_consistency.py, test_batch_invariance.py, test_kernels.py)")
        if self.options.reference == "golden":
            if not model.golden:
                pytest.skip(f"{model.path} has no goldens: use --reference live")
            ref = golden_reference(split_dialect(model.name)[0], dtype)  # a dialect view has its checkpoint's
            ref.model, ref.model_path = model.name, model.path
            return ref
        prompts, names = live_prompts(model.path)
        return live_reference(model.name, model.path, dtype, prompts, names)


# test_spec_decode*.py in the default sweep (no --model): each speculative config costs engines of its own
SPEC_DECODE_MODELS = ("qwen3-tiny",)


def speculative_cases(config: pytest.Config) -> list[SpecConfig]:
    """(checkpoint, speculative config) pairs of test_spec_decode*.py: the adapter factory's advertised configs
    (``speculative_configs(model_path)``) and --speculative-config's, per checkpoint of the sweep."""
    models = selected_models(config)
    if not config.getoption("--model"):
        models = [m for m in models if m.name in SPEC_DECODE_MODELS] or models[:1]
    return [c for m in models
            for c in configs_for(adapter_factory(config.getoption("--engine")), m,
                                 config.getoption("--speculative-config"))]


def adapter_factory(engine: str) -> Any:
    """The factory (class) --engine names, None where it cannot be imported here (its cases say so later)."""
    from nanovllm_ref.oracle.adapters import ADAPTERS, SERVER_ADAPTERS, resolve_factory, server_url

    prefix = engine.partition(":")[0]
    try:
        return resolve_factory(SERVER_ADAPTERS[prefix] if server_url(engine) else ADAPTERS.get(engine, engine))
    except (ImportError, AttributeError, ValueError, TypeError):
        return None


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
    # head_dim 128 (the fp8 decode kernel's head size on CUDA): batched decode
    "qwen3-hd128": ("test_alone_vs_batched",),
    # other tokenizer kinds (random weights), there for the text module: one batching case each
    "qwen3-words-hd32": ("test_alone_vs_batched",),
    "mistral-spm-hd32": ("test_alone_vs_batched",),
}

# TP=2 in bfloat16 (the half-precision all-reduce) in the default sweep: a dense Qwen3, the row-parallel biases added
# after the all-reduce, the MoE experts' all-reduce (~5 s each on 2 cores); --model runs it on any checkpoint
TP_BFLOAT16_SWEEP = ("qwen3-tiny", "llama3-bias-hd32", "qwen3-moe-unnorm-hd32")


# test_batch_invariance.py in the default sweep: a dense GQA model and the MoE one (routing per token must not see
# the batch); naming checkpoints with --model runs it on those
BATCH_INVARIANCE_MODELS = ("qwen3-tiny", "qwen3-moe-tiny")


def deselect_invariance_cases(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the invariance cases that :data:`INVARIANCE_CASES`, :data:`TP_BFLOAT16_SWEEP` and
    :data:`BATCH_INVARIANCE_MODELS` do not choose for a checkpoint (default sweep only)."""
    if config.getoption("--model"):
        return
    keep, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        spec = callspec.params.get("model_spec") if callspec else None
        chosen = INVARIANCE_CASES.get(spec.name) if isinstance(spec, ModelSpec) else None
        if isinstance(spec, ModelSpec) and getattr(item, "originalname", "") == "test_tensor_parallel_bfloat16":
            chosen = ("test_tensor_parallel_bfloat16",) if spec.name in TP_BFLOAT16_SWEEP else ()
        if Path(str(item.path)).name == "test_batch_invariance.py" and isinstance(spec, ModelSpec):
            (keep if spec.name in BATCH_INVARIANCE_MODELS else dropped).append(item)
        elif chosen is None or Path(str(item.path)).name != "test_invariance.py" or _is_chosen(item, chosen):
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
