#!/bin/bash
# Session 8, call 2 (nvidia-h200): the decode kernel's heads-adjacent flat grid (call 1's sweep) in the engine.
# 1. the headline greedy: this tree (ceilings, 3 runs) and the tree before it (.gpu_tree/base = b831b16, 3 runs),
#    then this tree at t=0.6 (2 runs);
# 2. the mixed-context sweep, round 2 (tiles and splits of the adopted grid);
# 3. the decode kernel on the GPU: the kernel tests and conformance's decode_attention part, two goldens.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
ROOT=$PWD L="$OUT/l"; mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
source "$(dirname "$0")/lib.sh"  # bench, pytest_bg, gpu_pytest, GOLDENS
bench "$ROOT" new_greedy --temperature 0 --repeat 3
bench .gpu_tree/base base_greedy --temperature 0 --repeat 3 --no-ceilings
bench "$ROOT" new_t06 --repeat 2 --no-ceilings
timeout 200 python3 perf/calls/s8_decode_mixed_sweep.py --round2 > "$L/sweep2.log" 2>&1; echo "sweep rc=$? t=$SECONDS"
grep -E "^copy|run .* ms|step [0-9]" "$L/sweep2.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_attention.py > "$L/kt.log" 2>&1
echo "kernel tests rc=$? $(tail -1 "$L/kt.log") t=$SECONDS"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu conformance/test_kernels.py -k decode_attention \
  --model qwen3-tiny --report /dev/null > "$L/kc.log" 2>&1; echo "conformance kernel rc=$? $(tail -1 "$L/kc.log")"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu conformance/test_golden.py --model qwen3-gqa4 \
  --model qwen3-tied-hd64 --engine-arg gpu_memory_utilization=0.04 --report /dev/null > "$L/gold.log" 2>&1
echo "goldens rc=$? $(tail -1 "$L/gold.log") t=$SECONDS"
tar -czf "$OUT/call2.tgz" -C "$OUT" l && rm -rf "$L"
