"""Every checkpoint x dtype: all golden prompts submitted at once, tokens / top-k / prompt logprobs compared with
the goldens (or, with --reference live, with transformers computed now) under the policy of
nanovllm_ref.oracle.compare (vLLM's check_logprobs_close plus value bounds from golden/manifest.json noise)."""

from __future__ import annotations

import pytest

from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
from nanovllm_ref.oracle.references import run_check

from .harness import tolerance_for


def test_golden(model_spec, dtype, options, engines, references, record) -> None:
    ref = references.get(model_spec, dtype)
    outputs = engines.generate(model_spec, dtype, ref)
    adapter = engines.get(model_spec, dtype)
    tolerance = tolerance_for(dtype, options, ref, getattr(adapter, "quantization", None))  # quantized: its tier
    report = run_check(adapter, ref, tolerance, case=ref.source, outputs=outputs)
    record(report)
    assert report.passed, "\n" + report.format_failures()


@pytest.mark.gpu
def test_golden_gpu(model_spec, options, references, record) -> None:
    """nanovllm_ref on CUDA (its GPU kernels) in bfloat16 against the bfloat16 goldens."""
    if options.engine != "nanovllm_ref":
        pytest.skip("the GPU variant drives nanovllm_ref; other engines pick their device themselves")
    ref = references.get(model_spec, "bfloat16")
    kwargs = {**dict(options.engine_args), **({"tensor_parallel_size": options.tp} if options.tp > 1 else {})}
    adapter = NanovllmRefAdapter(model_spec.path, "bfloat16", device="cuda", **kwargs)  # --engine-arg too
    try:
        report = run_check(adapter, ref, tolerance_for("bfloat16", options, ref), case=f"{ref.source}-cuda")
    finally:
        adapter.close()
    record(report)
    assert report.passed, "\n" + report.format_failures()
