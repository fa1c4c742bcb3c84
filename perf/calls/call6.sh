#!/bin/bash
# Device call 6 (issue 21): the final tree's headline (greedy), one run, H200 ceilings from FACTS.md.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 65 python3 -m perf.bench_engine --arch qwen3-0.6b --workload headline --temperature 0 --no-ceilings \
  --json "$OUT/final.json" 2>&1 | grep -v Warn | tail -14
