"""nanovllm_ref: a compact LLM inference engine that is also a correctness oracle and a performance gate."""

from .config import Config
from .llm import LLM
from .outputs import RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "Config", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
