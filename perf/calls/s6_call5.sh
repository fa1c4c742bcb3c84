#!/bin/bash
# Session 6, device call 5 (nvidia-h200-x2): call 4's GPU sampling conformance and four goldens again, now apart:
# the sampling engine alone on GPU 0 (call 4 started it at 0.9 beside four engines at 0.15: out of memory), the four
# goldens side by side on GPU 1 at gpu_memory_utilization 0.2.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$OUT/l"; L="$OUT/l"
(CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE conformance/test_sampling.py \
   --model qwen3-tiny --report /dev/null > "$L/sampling.log" 2>&1; echo "sampling rc=$? t=$SECONDS" >> "$L/rc.txt") &
for m in qwen3-gqa4 qwen2-tiny mistral-tiny qwen3-moe-tiny; do
  (CUDA_VISIBLE_DEVICES=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE conformance/test_golden.py \
     --model $m --engine-arg gpu_memory_utilization=0.2 --report "$L/rep_$m.json" > "$L/golden_$m.log" 2>&1
   echo "golden $m rc=$? t=$SECONDS" >> "$L/rc.txt") &
done
wait
cat "$L/rc.txt"
for f in "$L"/*.log; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -4; done
tar -czf "$OUT/call5.tgz" -C "$OUT" l && rm -rf "$L"
