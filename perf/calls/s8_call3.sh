#!/bin/bash
# Session 8, call 3 (nvidia-h200, main after the heads-adjacent decode grid and the mixed-context perf cases):
# 1. the split sweep at small batches (perf/calls/s8_split_sweep.py);
# 2. the step breakdown on this tree (perf.profile_step, acceptance 2's "after" for this session's change);
# 3. the kernel perf suite against baseline 0004 (gate median:10%), saved as the new baseline.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
L="$OUT/l"; mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 150 python3 perf/calls/s8_split_sweep.py > "$L/split_sweep.log" 2>&1; echo "split sweep rc=$? t=$SECONDS"
cat "$L/split_sweep.log"
timeout 200 python3 -m perf.profile_step --arch qwen3-0.6b --temperature 0 --json "$L/profile.json" > "$L/profile.log" 2>&1
echo "profile rc=$? t=$SECONDS"
timeout 200 python3 -m pytest perf/test_kernels.py -m gpu -q -p no:cacheprovider --benchmark-compare=0004 \
  --benchmark-compare-fail=median:10% --benchmark-autosave > "$L/perf_kernels.log" 2>&1
echo "perf kernels rc=$? t=$SECONDS"; grep -E "passed|failed|FAIL|Performance has regressed" "$L/perf_kernels.log" | head
sed -n '/fraction of the measured ceilings/,$p' "$L/perf_kernels.log" | head -40
cp perf/baselines/nvidia-h200/Linux-CPython-3.12-64bit/0005_* "$L/" 2>/dev/null; ls "$L"
tar -czf "$OUT/call3.tgz" -C "$OUT" l && rm -rf "$L"
