#!/bin/bash
# Device call 1 (issue 21): step breakdown + headline before (../.before_tree) and after the fused QKV epilogue.
# Run from the tree under test on the device: bash perf/calls/call1.sh
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
git log --oneline -1 2>/dev/null
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_qkv_epilogue.py 2>&1 | tail -3
(cd ../.before_tree && PYTHONPATH=. timeout 220 python3 -m perf.profile_step --temperature 0 --throughput 0,0.6 \
  --json "$OUT/before.json") > "$OUT/before.log" 2>&1
grep -v Warning "$OUT/before.log" | tail -62
timeout 220 python3 -m perf.profile_step --temperature 0 --throughput 0,0.6 --json "$OUT/after.json" > "$OUT/after.log" 2>&1
grep -v Warning "$OUT/after.log" | tail -62
