#!/bin/bash
# Session 8, call 8 (nvidia-h200): the headline on the final engine with its results saved as JSON (perf/results/,
# read by perf.report for perf/plots/): greedy (ceilings, 3 runs) and t=0.6 (3 runs).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$OUT/results"
for args in "--temperature 0 --repeat 3" "--repeat 3"; do
  timeout 150 python3 -m perf.bench_engine --arch qwen3-0.6b --workload headline $args > "$OUT/bench.log" 2>&1
  echo "bench $args rc=$? t=$SECONDS: $(grep -E 'ceilings|run [0-9]/|fraction of roofline|saved' "$OUT/bench.log" | tr -s ' ' | tr '\n' ' ')"
done
cp perf/results/2026*.json "$OUT/results/" 2>/dev/null; ls "$OUT/results"
