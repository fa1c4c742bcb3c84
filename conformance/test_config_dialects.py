"""Each golden checkpoint again in the config dialect published checkpoints use, with the same goldens.

transformers 5 writes the RoPE settings as one ``rope_parameters`` dict (the goldens' config.json); Llama 3.x, Qwen
and Mistral checkpoints on the hub (transformers 4) carry ``rope_theta`` at the top level and the scaling as
``rope_scaling``. An engine or converter that reads one dialect runs the other without its scaling or with a
default theta, silently: CTranslate2 4.8.5 runs llama3 scaling as none (conformance/README.md, "Peers"). Here the
checkpoint's ``rope_scaling`` view (oracle/dialects.py: links to its weights and tokenizer, config.json with only
the RoPE fields rewritten) must reproduce its goldens under the same policy and tolerance as test_golden.py, on
two prompts (a scaling or theta error moves every step: CTranslate2's costs 0.93 at the first one). The llama3
checkpoints (llama3-tiny, llama3-bias-hd32) are the ones whose scaling lives in ``rope_scaling``; every view moves
``rope_theta``. ``--model NAME@rope_scaling`` runs the whole golden set of a view through test_golden.py instead.
"""

from __future__ import annotations

import pytest

from nanovllm_ref.oracle.adapters import server_url
from nanovllm_ref.oracle.dialects import DIALECTS, LEGACY, legacy_view, split_dialect
from nanovllm_ref.oracle.references import run_check

from .harness import ModelSpec, tolerance_for

PROMPTS = ("short_12", "long_130")


def test_published_dialect(model_spec, dtype, options, engines, references, record) -> None:
    base, dialect = split_dialect(model_spec.name)
    if not model_spec.golden:
        pytest.skip(f"{model_spec.name} has no goldens: the view is compared with its checkpoint's goldens")
    if dialect != DIALECTS[0]:
        pytest.skip(f"--model {model_spec.name} names a dialect already (test_golden.py runs it)")
    if server_url(options.engine) is not None:  # it cannot be handed the view's folder
        pytest.skip(f"a server serves the one checkpoint it was started with: serve the {LEGACY} view (the folder "
                    f"nanovllm_ref.oracle.dialects.legacy_view writes) and run --model {base}@{LEGACY}")
    view = ModelSpec(f"{base}@{LEGACY}", legacy_view(model_spec.path), True)
    full = references.get(view, dtype)
    ref = full.subset([full.prompt_ids.index(p) for p in PROMPTS if p in full.prompt_ids] or [0])
    adapter = engines.get(view, dtype)
    tolerance = tolerance_for(dtype, options, ref, getattr(adapter, "quantization", None))
    report = run_check(adapter, ref, tolerance, case=f"{ref.source}-{LEGACY}")
    record(report)
    assert report.passed, "\n" + report.format_failures()
