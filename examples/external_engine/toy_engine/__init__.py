"""toy_engine: a tiny greedy LLM engine (transformers forward, its own decode loop) and its conformance adapter."""

from .engine import ToyEngine, ToyResult

__all__ = ["ToyEngine", "ToyResult"]
