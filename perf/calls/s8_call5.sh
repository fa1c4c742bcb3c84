#!/bin/bash
# Session 8, call 5 (nvidia-h200) on main after merging s8-gate (the device-time gate) and the new kernel mutants:
# 1. alone on the GPU: the kernel perf suite against baseline 0005 with both gates (device time 10%, wall 10%);
#    then perf/gate_demo.sh (GPU mode: the slowed decode kernel must trip each gate, the control must pass);
# 2. the GPU column of this session's new Triton-kernel mutants.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
L="$OUT/l"; mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 python3 -m pytest perf/test_kernels.py -m gpu -q -p no:cacheprovider --benchmark-compare=0005 \
  --event-compare-fail=10 --benchmark-compare-fail=median:10% > "$L/perf_kernels.log" 2>&1
echo "perf kernels vs 0005, both gates: rc=$? t=$SECONDS"
sed -n '/device-time gate/,$p' "$L/perf_kernels.log" | head -40; tail -3 "$L/perf_kernels.log"
timeout 300 bash perf/gate_demo.sh > "$L/gate_demo.log" 2>&1; echo "gate demo rc=$? t=$SECONDS"
grep -E "^==|gate demo|exit code|REGRESSED|device-time gate|regressed" "$L/gate_demo.log" | head -30
timeout 250 python3 -m tools.mutants --gpu --only gumbel-splits-share-a-slot silu-kernel-one-column-block \
  prefill-kernel-one-query-tile --jobs 6 --timeout 200 --budget 230 --out "$L/mutant_gpu" > "$L/mutant_gpu.log" 2>&1
echo "mutants rc=$? t=$SECONDS"; tail -8 "$L/mutant_gpu.log"
tar -czf "$OUT/call5.tgz" -C "$OUT" l && rm -rf "$L"
