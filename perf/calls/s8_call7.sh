#!/bin/bash
# Session 8, call 7 (nvidia-h200): the GPU column of mutant graph-pad-slot-zero (CUDA-graph padding rows storing
# K/V into slot 0), and the kernel module's fixed inputs on CUDA tensors (the FIXED_INPUTS registry after call 4).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
L="$OUT/l"; mkdir -p "$L"
(timeout 200 python3 -m pytest -q -p no:cacheprovider conformance/test_kernels.py -k fixed --model qwen3-tiny \
   --report /dev/null > "$L/fixed.log" 2>&1; echo "fixed inputs rc=$? $(tail -1 "$L/fixed.log")" >> "$L/rc.txt") &
timeout 250 python3 -m tools.mutants --gpu --only graph-pad-slot-zero --jobs 2 --timeout 220 --budget 240 \
  --out "$L/mutant_gpu" > "$L/mutant_gpu.log" 2>&1; echo "mutant rc=$? t=$SECONDS"
wait; cat "$L/rc.txt"; tail -6 "$L/mutant_gpu.log"
tar -czf "$OUT/call7.tgz" -C "$OUT" l && rm -rf "$L"
