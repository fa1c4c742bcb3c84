#!/bin/bash
# Session 7, the final device call (nvidia-h200) on merged main (async prefill in):
# 1. alone on the GPU: the headline greedy (ceilings, 3 runs) of main and of the tree before the async merge
#    (.gpu_tree/base), interleaved; main at t=0.6; the GPU's idle time window by window (call 5's script: the prefill windows);
# 2. then side by side: `pytest conformance -m gpu` over the twelve goldens, the GPU sampling module, the kernel
#    module in one process per kernel, and the GPU column of the new mutant rotary-kernel-half-mask.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
ROOT=$PWD L="$OUT/l"; mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
source "$(dirname "$0")/lib.sh"  # bench, pytest_bg, gpu_pytest, GOLDENS
bench "$ROOT" main_greedy --temperature 0 --repeat 3
[ -d .gpu_tree/base ] && bench .gpu_tree/base base_greedy --temperature 0 --repeat 3 --no-ceilings
bench "$ROOT" main_t06 --repeat 2 --no-ceilings
timeout 150 python3 perf/calls/s7_idle_timeline.py > "$L/idle_after.log" 2>&1; echo "idle timeline rc=$? t=$SECONDS"
for m in "${GOLDENS[@]}"; do
  gpu_pytest "golden_$m" 200 conformance/test_golden.py --model $m --engine-arg gpu_memory_utilization=0.04 \
    --report "$L/rep_$m.json"
done
gpu_pytest sampling 200 conformance/test_sampling.py --model qwen3-tiny --engine-arg gpu_memory_utilization=0.08 \
  --report /dev/null
for k in prefill_attention decode_attention store_kv rms_norm apply_rotary silu_and_mul fused_moe gumbel_sample \
         qkv_epilogue; do
  gpu_pytest "kernel_$k" 200 conformance/test_kernels.py -k "$k" --model qwen3-tiny --report /dev/null
done
(timeout 200 python3 -m tools.mutants --gpu --only rotary-kernel-half-mask --jobs 2 --timeout 180 --budget 190 \
   --out "$L/mutant_gpu" > "$L/mutant_gpu.log" 2>&1; echo "mutant_gpu rc=$? t=$SECONDS" >> "$L/rc.txt") &
wait
sort "$L/rc.txt"
for f in "$L"/golden_*.log "$L"/sampling.log "$L"/kernel_*.log; do
  echo "== $(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; grep -E "^(FAILED|ERROR)" "$f" | head -3
done
tail -4 "$L/mutant_gpu.log"
grep -E "^(profiled|\| [0-9])" "$L/idle_after.log"
tar -czf "$OUT/final.tgz" -C "$OUT" l && rm -rf "$L"
