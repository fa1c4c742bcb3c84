#!/bin/bash
# Session 6, device call 4 (nvidia-h200-x2), tree = main after merging s6-sharp.
# GPU 0: the GPU column of the mutation table (issue 17 acceptance 3): `python3 -m tools.mutants --gpu`, every
#   Triton-kernel mutant against `pytest conformance -m gpu`, baselines first (their passing is also the GPU kernel
#   conformance run after the silu/non-finite fix).
# GPU 1: the GPU sampling conformance (issue 18 acceptance 2, min-tokens fixed) and the four goldens not yet run to
#   the end in calls 2-3, side by side at gpu_memory_utilization 0.15 (now this engine's share of the GPU).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$OUT/l"; L="$OUT/l"
(CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE conformance/test_sampling.py \
   --model qwen3-tiny --report /dev/null > "$L/sampling.log" 2>&1; echo "sampling rc=$? t=$SECONDS" >> "$L/rc.txt") &
for m in qwen3-gqa4 qwen2-tiny mistral-tiny qwen3-moe-tiny; do
  (CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE conformance/test_golden.py \
     --model $m --engine-arg gpu_memory_utilization=0.15 --report "$L/rep_$m.json" > "$L/golden_$m.log" 2>&1
   echo "golden $m rc=$? t=$SECONDS" >> "$L/rc.txt") &
done
CUDA_VISIBLE_DEVICES=0 timeout 300 python3 -m tools.mutants --gpu --jobs 14 --timeout 250 --budget 270 \
  --out "$L/mutants_gpu" > "$L/mutants_gpu.log" 2>&1
echo "mutants rc=$? t=$SECONDS"
wait
cat "$L/rc.txt"; tail -25 "$L/mutants_gpu.log"
for f in "$L"/*.log; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -4; done
tar -czf "$OUT/call4.tgz" -C "$OUT" l && rm -rf "$L"
