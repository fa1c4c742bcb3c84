#!/bin/bash
# Session 6, device call 7 (nvidia-h200), the final tree of the session (all merges): `pytest conformance -m gpu`
# over the twelve goldens (side by side at gpu_memory_utilization 0.05), the GPU kernel module and the GPU sampling
# conformance (0.1); then, alone on the GPU, the headline greedy (issue 21).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$OUT/l"; L="$OUT/l"
for m in qwen3-tiny qwen3-gqa4 qwen2-tiny llama3-tiny mistral-tiny qwen3-moe-tiny qwen3-tied-hd64 qwen3-bias-hd32 \
         qwen2-hd64 llama3-bias-hd32 mistral-hd64 qwen3-moe-unnorm-hd32; do
  (timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE conformance/test_golden.py --model $m \
     --engine-arg gpu_memory_utilization=0.05 --report "$L/rep_$m.json" > "$L/golden_$m.log" 2>&1
   echo "golden $m rc=$? t=$SECONDS" >> "$L/rc.txt") &
done
(timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE conformance/test_kernels.py --model qwen3-tiny \
   --report /dev/null > "$L/kernels.log" 2>&1; echo "kernels rc=$? t=$SECONDS" >> "$L/rc.txt") &
(timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE conformance/test_sampling.py --model qwen3-tiny \
   --engine-arg gpu_memory_utilization=0.1 --report /dev/null > "$L/sampling.log" 2>&1
 echo "sampling rc=$? t=$SECONDS" >> "$L/rc.txt") &
wait
cat "$L/rc.txt"
for f in "$L"/*.log; do echo "== $(basename $f): $(grep -E 'passed|failed' "$f" | tail -1)"; grep -E "^(FAILED|ERROR)" "$f" | head -3; done
timeout 90 python3 -m perf.bench_engine --arch qwen3-0.6b --workload headline --temperature 0 --no-save \
  --json "$L/headline.json" 2>&1 | grep -E "output tok/s|fraction of roofline|run 1"
tar -czf "$OUT/call7.tgz" -C "$OUT" l && rm -rf "$L"
