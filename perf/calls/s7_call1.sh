#!/bin/bash
# Session 7, device call 1 (nvidia-h200): the headline on main 1094318 on a fresh machine (greedy x3 with
# ceilings, t=0.6 once), then the decode-GEMM sweep (perf/calls/s7_gemm_sweep.py).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
bench() {  # tag, args...
  local tag=$1; shift
  PYTHONPATH=. timeout 200 python3 -m perf.bench_engine --arch qwen3-0.6b --workload headline \
     --json "$OUT/$tag.json" --no-save "$@" > "$OUT/$tag.log" 2>&1
  echo "$tag rc=$? t=$SECONDS: $(grep 'output tok/s' "$OUT/$tag.log" | tr '\n' ' ') $(grep -m1 'fraction of roofline' "$OUT/$tag.log")"
}
bench greedy --temperature 0 --repeat 3
bench t06 --no-ceilings
PYTHONPATH=. timeout 240 python3 perf/calls/s7_gemm_sweep.py > "$OUT/gemm.log" 2>&1; echo "sweep rc=$? t=$SECONDS"
tail -16 "$OUT/gemm.log"
