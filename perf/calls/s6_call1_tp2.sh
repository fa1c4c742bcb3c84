#!/bin/bash
# Session 6, device call 1 (nvidia-h200-x2; issue 21 acceptance 3): TP=1 vs TP=2 on the Qwen3-8B architecture,
# the first 128 headline requests (median of 2 runs each); TP=2 GPU conformance of four goldens (two with
# o_proj/down_proj biases, the unnormalized MoE); the perf suite's TP cases saved to perf/baselines/nvidia-h200-x2/.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
for tp in 1 2; do
  timeout 150 python3 -m perf.bench_engine --arch qwen3-8b --workload headline --num-requests 128 --tp $tp \
    --repeat 2 --json "$OUT/tp$tp.json" > "$OUT/tp$tp.log" 2>&1; echo "tp$tp rc=$?"; grep -v Warn "$OUT/tp$tp.log" | tail -14
done
for m in qwen3-tiny qwen3-bias-hd32 llama3-bias-hd32 qwen3-moe-unnorm-hd32; do
  echo "== conformance tp2 $m (t=$SECONDS s)"
  timeout 100 python3 -m pytest -q -p no:cacheprovider conformance/test_golden.py -m gpu --tp 2 --model $m \
    > "$OUT/conf_tp2_$m.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/conf_tp2_$m.log"
done
left=$((570 - SECONDS)); echo "perf suite TP cases with ${left}s left"
if [ $left -gt 120 ]; then
  timeout $left python3 -m pytest -q -p no:cacheprovider perf/test_engine.py -m gpu -k tp_scaling --arch qwen3-8b \
    --benchmark-autosave > "$OUT/perf_tp.log" 2>&1; echo "rc=$?"; grep -v Warn "$OUT/perf_tp.log" | tail -20
  mkdir -p "$OUT/baselines" && cp -r perf/baselines/nvidia-h200-x2 "$OUT/baselines/" 2>/dev/null
fi
