#!/bin/bash
# For nvidia-h200-x2 (issue 21, acceptance 3; not run in session 5: only one-GPU machines were lent).
# TP=1 vs TP=2 on the Qwen3-8B architecture, the first 128 headline requests (async scheduling is on under TP since
# 10e9665); TP=2 GPU conformance; the perf suite's TP cases saved as baselines (perf/baselines/<gpu slug>/).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
for tp in 1 2; do
  timeout 240 python3 -m perf.bench_engine --arch qwen3-8b --workload headline --num-requests 128 --tp $tp \
    --json "$OUT/tp$tp.json" 2>&1 | grep -v Warn | tail -12
done
timeout 200 python3 -m pytest -q -p no:cacheprovider conformance -m gpu --tp 2 --model qwen3-tiny --model qwen3-gqa4 \
  2>&1 | tail -3
timeout 400 python3 -m pytest -q -p no:cacheprovider perf/test_engine.py -m gpu -k tp_scaling --arch qwen3-8b \
  --benchmark-autosave 2>&1 | tail -15
