"""The goldens in every mode an engine advertises: a mode is a setting that must not change what the engine computes
(batch invariance, async scheduling), so each gets the same check as the default, and a mode that promises bitwise
batch invariance also gets the exact needle-in-batch check of test_batch_invariance.py.

An adapter advertises its modes with the optional ``modes() -> {name: (engine settings, promises batch
invariance)}`` (nanovllm_ref: ``batch_invariant=True``, and async scheduling on the CPU, off on CUDA where it is the
default); an adapter without it is reported as not checked here. Engines whose modes are process-wide (vLLM's
``VLLM_BATCH_INVARIANT=1``) run the other modules with ``--engine-arg`` instead.
"""

from __future__ import annotations

import pytest

from nanovllm_ref.oracle.references import run_check

from .harness import tolerance_for
from .test_batch_invariance import SIZES, run_case

EXACT_TRIALS = 2  # compositions per needle in a bitwise mode (test_batch_invariance.py runs more with its options)
EXACT_SIZES = SIZES[:5]  # small batches: the default run stays short


def advertised(engines, model_spec, dtype) -> dict:
    adapter = engines.get(model_spec, dtype)
    modes = getattr(adapter, "modes", None)
    if modes is None:
        pytest.skip(f"{getattr(adapter, 'name', adapter)} advertises no engine modes (needs modes())")
    return modes()


@pytest.mark.parametrize("index", range(2), ids=lambda i: f"mode-{i}")
def test_golden_in_mode(model_spec, dtype, options, engines, references, record, index) -> None:
    """The goldens with the mode's settings on: tokens and logprobs under the policy of test_golden.py; in a mode
    that promises batch invariance, also a needle alone and in random batches, bitwise."""
    modes = sorted(advertised(engines, model_spec, dtype).items())
    if index >= len(modes):
        pytest.skip(f"the engine advertises {len(modes)} modes")
    name, (settings, invariant) = modes[index]
    ref = references.get(model_spec, dtype)
    outputs = engines.generate(model_spec, dtype, ref, **settings)
    adapter = engines.get(model_spec, dtype, **settings)
    report = run_check(adapter, ref, tolerance_for(dtype, options, ref), case=f"{ref.source} [{name}]",
                       outputs=outputs)
    record(report)
    assert report.passed, f"mode {name} ({settings}):\n" + report.format_failures()
    if invariant:
        run_case(adapter, references.prompts(model_spec, dtype), dtype, "exact", EXACT_TRIALS, record,
                 f"mode {name}", prefix_cache=True, sizes=EXACT_SIZES)
