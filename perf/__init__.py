"""Performance suite of nanovllm_ref: kernel and engine benchmarks, peers, profiles, regression gates, report.

Entry points: `nanovllm-ref bench` (the engine benchmark, shipped in nanovllm_ref/testing/bench), `python -m
perf.device PLAN` (named plans for a GPU machine), `python -m perf.peers` (transformers, vLLM, SGLang on the same
workload), `pytest perf` (pytest-benchmark suites and the gates), `python -m perf.report` (markdown and plots).
See perf/README.md; the current figures are in perf/RESULTS.md.
"""
