"""Repo-wide pytest setup: Hypothesis profiles (select with HYPOTHESIS_PROFILE=ci|dev|thorough|mutants), the
Triton interpreter on machines without a GPU (set before any kernel module defines its @triton.jit), and the
conformance plugin for a checkout that is not pip-installed."""

import os
import sys

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "ci", max_examples=60, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
settings.register_profile(
    "dev", max_examples=200, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
settings.register_profile(
    "thorough", max_examples=10_000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
settings.register_profile(  # tools/mutants.py: the ci examples, reported without shrinking (a mutant is caught
    # by the first failing example; shrinking it through the Triton interpreter would take minutes)
    "mutants", parent=settings.get_profile("ci"), phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# The conformance options and summary (nanovllm_ref/oracle/pytest_plugin.py). A pip-installed nanovllm_ref has
# pytest load it through the `pytest11` entry point before any conftest (or `-p` imports it): registering the
# same module a second time would fail, so only a plain checkout registers it here.
PLUGIN = "nanovllm_ref.oracle.pytest_plugin"
pytest_plugins = [] if PLUGIN in sys.modules else [PLUGIN]
