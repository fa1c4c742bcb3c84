"""The MoE router's precision: a checkpoint with near-tied router logits against transformers computed now.

A router softmax (or top-k) taken in bfloat16 instead of float32 passes the bf16 goldens of both MoE checkpoints:
their logits are spread, so bf16 probabilities rarely tie, and the weights round to bf16 either way. Here the
engine runs a derived checkpoint (nanovllm_ref/oracle/moe_router.py: every router gate weight x 2**-10, written to
a temporary folder), whose logits keep their order and relative spacing but are ~1e-3, so that a bf16 softmax
rounds a row's probabilities to one or two values and picks experts by index. The reference is transformers on
that checkpoint in the same dtype (``live_reference``: eager, one prompt at a time), the golden prompts, and the
tolerance the suite derives for a live reference (tolerances.py: 3 x the noise measured between transformers eager
and sdpa, per position and for the set's mean |dlogprob|, ``mean_tol``). Measured in bf16 (moe_router.py): noise
means 0.038 / 0.039 on qwen3-moe-tiny / qwen3-moe-unnorm-hd32 (mean_tol 0.113 / 0.117), nanovllm_ref 0.039 / 0.040,
its router softmax in bf16 1.20 / 0.92, 10.6x / 7.8x over. In float32 the same check holds the near-uniform
routing weights to the float32 floor. Skipped for a checkpoint that is no mixture of experts and for a server (it
serves its own checkpoint: serve the folder ``near_tied_router_checkpoint`` writes and run ``test_golden.py
--reference live`` with ``--model`` that folder).
"""

from __future__ import annotations

import pytest

from nanovllm_ref.oracle.adapters import server_url
from nanovllm_ref.oracle.moe_router import is_moe_checkpoint, near_tied_router_checkpoint
from nanovllm_ref.oracle.references import Reference, golden_reference, live_reference, run_check

from .harness import ModelSpec, live_prompts, tolerance_for

CAPABILITY = "moe router"
SUFFIX = "near-tied-router"
_VIEWS: dict[str, str] = {}  # checkpoint folder -> its near-tied view's folder
_REFS: dict[tuple[str, str], Reference] = {}  # (view folder, dtype) -> transformers' reference on it


@pytest.fixture(scope="session")
def router_root(tmp_path_factory):
    return tmp_path_factory.mktemp("moe-router")


def _prompts(model_spec: ModelSpec) -> tuple[list[list[int]], list[str]]:
    if model_spec.golden:
        g = golden_reference(model_spec.name, "float32")
        return g.prompts, g.prompt_ids
    return live_prompts(model_spec.path)


def view_and_reference(model_spec: ModelSpec, dtype: str, root) -> tuple[ModelSpec, Reference]:
    """(the near-tied view, transformers' reference on it in ``dtype`` with its noise), each made once a session."""
    if model_spec.path not in _VIEWS:
        _VIEWS[model_spec.path] = near_tied_router_checkpoint(model_spec.path, root / model_spec.name)
    view = ModelSpec(f"{model_spec.name}-{SUFFIX}", _VIEWS[model_spec.path], False)
    if (view.path, dtype) not in _REFS:
        prompts, names = _prompts(model_spec)
        _REFS[view.path, dtype] = live_reference(view.name, view.path, dtype, prompts, names)
    return view, _REFS[view.path, dtype]


def test_router_precision(model_spec, dtype, options, engines, record, router_root) -> None:
    if not is_moe_checkpoint(model_spec.path):
        pytest.skip(f"{model_spec.name} is not a mixture of experts (config.json has no num_experts_per_tok)")
    if server_url(options.engine) is not None:
        pytest.skip("a server serves the one checkpoint it was started with: serve the folder "
                    "nanovllm_ref.oracle.moe_router.near_tied_router_checkpoint writes and run test_golden.py "
                    "--reference live --model FOLDER")
    view, ref = view_and_reference(model_spec, dtype, router_root)
    adapter = engines.get(view, dtype)
    tolerance = tolerance_for(dtype, options, ref, getattr(adapter, "quantization", None))
    report = run_check(adapter, ref, tolerance, case=SUFFIX)
    engines.close()  # built on a view no other module uses
    record(report)
    assert report.passed, "\n" + report.format_failures()
