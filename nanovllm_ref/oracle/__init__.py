"""The correctness oracle: compare any engine's greedy generations with a reference (goldens or live HF)."""

from .adapters import ADAPTERS, SERVER_ADAPTERS, EngineAdapter, HFAdapter, NanovllmRefAdapter, load_adapter
from .compare import ConformanceReport, EngineOutput, PromptReport, compare_all, compare_outputs
from .served import ServerMismatch

__all__ = [
    "ADAPTERS", "SERVER_ADAPTERS", "ConformanceReport", "EngineAdapter", "EngineOutput", "HFAdapter",
    "NanovllmRefAdapter", "PromptReport", "ServerMismatch", "compare_all", "compare_outputs", "load_adapter",
]
