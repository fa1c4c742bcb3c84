"""Performance suite of nanovllm_ref: engine and kernel benchmarks, peers, roofline, regression gate.

Entry points: `python -m perf.bench_engine` (throughput / latency CLI), `python -m perf.peers` (transformers,
vLLM, SGLang on the same workload), `pytest perf` (pytest-benchmark suites and the regression gate),
`python -m perf.report` (markdown table and plots). See perf/README.md.
"""
