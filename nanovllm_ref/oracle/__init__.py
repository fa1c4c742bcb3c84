"""The correctness oracle: compare any engine's greedy generations with a reference (goldens or live HF)."""

from .adapters import ADAPTERS, EngineAdapter, HFAdapter, NanovllmRefAdapter, load_adapter
from .compare import ConformanceReport, EngineOutput, PromptReport, compare_all, compare_outputs

__all__ = [
    "ADAPTERS", "ConformanceReport", "EngineAdapter", "EngineOutput", "HFAdapter", "NanovllmRefAdapter",
    "PromptReport", "compare_all", "compare_outputs", "load_adapter",
]
