"""The engine benchmark that ships with the package: `nanovllm-ref bench` works from an install.

- `cli.py`: the command (throughput on a workload, TTFT / TPOT latency, against the roofline), a progress bar;
  results to `--json` / `--out` or the user cache folder (`tables.results_dir()`).
- `workloads.py`: nano-vllm's headline workload (its bench.py, token for token) and smaller variants.
- `models.py`: config.json folders of the published Qwen3 shapes for random-weight runs, and `ModelShape`.
- `roofline.py`: a lower bound on a workload's wall time from the model shape and the device's ceilings.
- `device.py`: device name and versions, measured ceilings (copy bandwidth, matmul rate), event timing.
- `runner.py`: build and warm up an engine, time a workload, TTFT / TPOT through the step API.
The benchmark suite and the regression gate that build on these (`pytest perf`) live in the source tree's perf/.
"""
