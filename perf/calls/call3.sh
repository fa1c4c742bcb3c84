#!/bin/bash
# Device call 3 (issue 21): profile + headline of ../.before_tree (tree f42d204: fused epilogue, pinned inputs,
# longest-first decode) and of this tree (+ contiguous pinned block-table staging, block-run prefill slots);
# GPU conformance of the six golden checkpoints with CUDA graphs on.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
(cd ../.before_tree && PYTHONPATH=. timeout 200 python3 -m perf.profile_step --temperature 0 --throughput 0,0.6 \
  --json "$OUT/before3.json") > "$OUT/before3.log" 2>&1
grep -A14 "steady decode" "$OUT/before3.log"; grep headline "$OUT/before3.log"
timeout 200 python3 -m perf.profile_step --temperature 0 --throughput 0,0.6 --json "$OUT/after3.json" > "$OUT/after3.log" 2>&1
grep -v Warn "$OUT/after3.log" | grep -v "^\s*$" | grep -v "^  _warn" | tail -48
timeout 280 python3 -m pytest -q -p no:cacheprovider conformance -m gpu --model qwen3-tiny --model qwen3-gqa4 \
  --model qwen2-tiny --model llama3-tiny --model mistral-tiny --model qwen3-moe-tiny 2>&1 | tail -3
