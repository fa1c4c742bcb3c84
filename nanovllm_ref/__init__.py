"""nanovllm_ref: a compact LLM inference engine that is also a correctness oracle and a performance gate.

`LLM` is imported on first use (it brings torch), so that `nanovllm-ref --version`, `--help` and command-line
mistakes answer at once.
"""

from typing import Any

from .config import Config
from .outputs import RequestOutput
from .sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "Config", "RequestOutput", "SamplingParams", "StructuredOutputsParams"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from .llm import LLM

        return LLM
    raise AttributeError(f"module 'nanovllm_ref' has no attribute {name!r}")
