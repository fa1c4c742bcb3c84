#!/bin/bash
# Session 8, call 4 (nvidia-h200) on main 08d6a88 (heads-adjacent decode grid, the fixed decode conformance batch):
# 1. alone on the GPU: the headline greedy (ceilings, 3 runs) and at t=0.6 (3 runs);
# 2. then side by side: `pytest conformance -m gpu` over the twelve goldens, the GPU sampling module, the kernel
#    module in one process per kernel, the new fixed decode batch on CUDA tensors, and the GPU column of the new
#    mutant decode-grid-split-as-head.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
ROOT=$PWD L="$OUT/l"; mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
source "$(dirname "$0")/lib.sh"  # bench, pytest_bg, gpu_pytest, GOLDENS
bench "$ROOT" main_greedy --temperature 0 --repeat 3
bench "$ROOT" main_t06 --repeat 3
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
pytest_bg every_split 200 conformance/test_kernels.py -k every_split --model qwen3-tiny --report /dev/null
(timeout 200 python3 -m tools.mutants --gpu --only decode-grid-split-as-head --jobs 2 --timeout 180 --budget 190 \
   --out "$L/mutant_gpu" > "$L/mutant_gpu.log" 2>&1; echo "mutant_gpu rc=$? t=$SECONDS" >> "$L/rc.txt") &
wait
sort "$L/rc.txt"
for f in "$L"/golden_*.log "$L"/sampling.log "$L"/kernel_*.log "$L"/every_split.log; do
  echo "== $(basename "$f"): $(grep -E 'passed|failed' "$f" | tail -1)"; grep -E "^(FAILED|ERROR)" "$f" | head -3
done
tail -4 "$L/mutant_gpu.log"
tar -czf "$OUT/final.tgz" -C "$OUT" l && rm -rf "$L"
