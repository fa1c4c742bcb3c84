#!/bin/bash
# Device call 2 (issue 21): kernel tests; profile + headline of ../.before_tree (pinned inputs, tree 0f21702) and
# of this tree (+ longest-first decode order); GPU conformance of the six golden checkpoints with CUDA graphs.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_qkv_epilogue.py \
  tests/kernels/test_kernel_attention.py tests/kernels/test_kernel_norm_rotary.py 2>&1 | grep -v Warn | tail -12
(cd ../.before_tree && PYTHONPATH=. timeout 200 python3 -m perf.profile_step --temperature 0 --throughput 0,0.6 \
  --json "$OUT/pinned.json") > "$OUT/pinned.log" 2>&1
grep -A14 "steady decode" "$OUT/pinned.log"; grep headline "$OUT/pinned.log"
timeout 200 python3 -m perf.profile_step --temperature 0 --throughput 0,0.6 --json "$OUT/order.json" > "$OUT/order.log" 2>&1
grep -v Warn "$OUT/order.log" | grep -v "^\s*$" | tail -75
timeout 280 python3 -m pytest -q -p no:cacheprovider conformance -m gpu --model qwen3-tiny --model qwen3-gqa4 \
  --model qwen2-tiny --model llama3-tiny --model mistral-tiny --model qwen3-moe-tiny 2>&1 | tail -8
