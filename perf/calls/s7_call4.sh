#!/bin/bash
# Session 7, device call 4 (nvidia-h200): the headline at KV block sizes 16 (default) and 256 (nano-vllm's),
# greedy, interleaved, on main 69c8647+ (prefill tiles of call 3).
export PYTHONUNBUFFERED=1
bench() {  # tag, args...
  local tag=$1; shift
  PYTHONPATH=. timeout 150 python3 -m perf.bench_engine --arch qwen3-0.6b --workload headline --temperature 0 \
     --no-save "$@" > "$OUT/$tag.log" 2>&1
  echo "$tag rc=$? t=$SECONDS: $(grep 'output tok/s' "$OUT/$tag.log" | tr -s ' ' | tr '\n' ' ')"
}
bench bs16a --block-size 16
bench bs256a --block-size 256 --no-ceilings
bench bs16b --block-size 16 --no-ceilings
bench bs256b --block-size 256 --no-ceilings
