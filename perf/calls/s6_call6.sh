#!/bin/bash
# Session 6, device call 6 (nvidia-h200, one GPU), tree = main after merging s6-peers (the golden policy's new
# set-mean bound) and s6-sharp (three more Triton mutants): `pytest conformance/test_golden.py -m gpu` on all twelve
# goldens side by side (gpu_memory_utilization 0.05 each) under the new policy, and the GPU column of the three
# new mutants (silu-kernel-sign, fused-moe-kernel-acc-reset, qkv-epilogue-v-from-k) with their baselines.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$OUT/l"; L="$OUT/l"
for m in qwen3-tiny qwen3-gqa4 qwen2-tiny llama3-tiny mistral-tiny qwen3-moe-tiny qwen3-tied-hd64 qwen3-bias-hd32 \
         qwen2-hd64 llama3-bias-hd32 mistral-hd64 qwen3-moe-unnorm-hd32; do
  (timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE conformance/test_golden.py --model $m \
     --engine-arg gpu_memory_utilization=0.05 --report "$L/rep_$m.json" > "$L/golden_$m.log" 2>&1
   echo "golden $m rc=$? t=$SECONDS" >> "$L/rc.txt") &
done
timeout 260 python3 -m tools.mutants --gpu --only silu-kernel-sign fused-moe-kernel-acc-reset qkv-epilogue-v-from-k \
  --jobs 6 --timeout 220 --budget 240 --out "$L/mutants_gpu" > "$L/mutants_gpu.log" 2>&1
echo "mutants rc=$? t=$SECONDS"
wait
cat "$L/rc.txt"; grep -E "^\| (silu|fused|qkv|baseline)|caught [0-9]" "$L/mutants_gpu.log"
for f in "$L"/golden_*.log; do echo "== $(basename $f): $(grep -E 'passed|failed' "$f" | tail -1)"; grep -E "^(FAILED|E  .*set)" "$f" | head -3; done
tar -czf "$OUT/call6.tgz" -C "$OUT" l && rm -rf "$L"
