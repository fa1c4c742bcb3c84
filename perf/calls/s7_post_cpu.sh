#!/bin/bash
# Session 7, device call 9 (nvidia-h200): main after the s7-cpu merge (CPU-only changes; the GPU path must be
# unchanged): the twelve goldens and the sampling module side by side, then one headline run alone.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
L="$OUT/l"; mkdir -p "$L"
source "$(dirname "$0")/lib.sh"  # bench, pytest_bg, gpu_pytest, GOLDENS
for m in "${GOLDENS[@]}"; do
  gpu_pytest "golden_$m" 150 conformance/test_golden.py --model $m --engine-arg gpu_memory_utilization=0.04 --report /dev/null
done
gpu_pytest sampling 150 conformance/test_sampling.py --model qwen3-tiny --engine-arg gpu_memory_utilization=0.08 \
  --report /dev/null
wait
sort "$L/rc.txt"
for f in "$L"/*.log; do echo "== $(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; grep -E "^(FAILED|ERROR)" "$f" | head -3; done
timeout 90 python3 -m perf.bench_engine --arch qwen3-0.6b --workload headline --temperature 0 --no-ceilings \
  --no-save 2>&1 | grep -E "run 1|fraction of roofline"
