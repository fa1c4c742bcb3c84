#!/bin/bash
# Session 6, device call 3 (nvidia-h200-x2): `pytest conformance -m gpu` over the twelve goldens (GPU 0: four
# processes, each engine at gpu_memory_utilization 0.2 so they fit side by side: call 2 ran them at 0.9 and three
# of them found no room for a KV block), and the GPU kernel + sampling conformance on GPU 1 (verbose: two failed in
# call 2, one with "relative error nan"). All logs come back in one tarball.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p "$OUT/logs"; L="$OUT/logs"
conf() {  # name, gpu, args...
  local n=$1 g=$2; shift 2
  (CUDA_VISIBLE_DEVICES=$g timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE \
     --report "$L/rep_$n.json" "$@" > "$L/conf_$n.log" 2>&1; echo "conf $n rc=$? t=$SECONDS" >> "$L/rc.txt") &
}
EA="--engine-arg gpu_memory_utilization=0.2"
conf g1 0 conformance/test_golden.py $EA --model qwen3-tiny --model qwen3-gqa4 --model qwen2-tiny
conf g2 0 conformance/test_golden.py $EA --model llama3-tiny --model mistral-tiny --model qwen3-moe-tiny
conf g3 0 conformance/test_golden.py $EA --model llama3-bias-hd32 --model mistral-hd64 --model qwen2-hd64
conf g4 0 conformance/test_golden.py $EA --model qwen3-bias-hd32 --model qwen3-moe-unnorm-hd32 --model qwen3-tied-hd64
(CUDA_VISIBLE_DEVICES=1 timeout 200 python3 -m pytest -p no:cacheprovider -m gpu -rfE -v conformance/test_kernels.py \
   --model qwen3-tiny --report /dev/null > "$L/kernels.log" 2>&1; echo "kernels rc=$? t=$SECONDS" >> "$L/rc.txt"
 CUDA_VISIBLE_DEVICES=1 timeout 300 python3 -m pytest -p no:cacheprovider -m gpu -rfE -v conformance/test_sampling.py \
   --model qwen3-tiny --report /dev/null > "$L/sampling.log" 2>&1; echo "sampling rc=$? t=$SECONDS" >> "$L/rc.txt") &
wait
cat "$L/rc.txt"
for f in "$L"/*.log; do echo "== $f"; grep -E "^(FAILED|ERROR)|passed|failed" "$f" | tail -6; done
grep -B30 "relative error" "$L/kernels.log" | grep -E "Falsifying|draw|kernel|magnitude|dtype|shape|def |E  " | head -40
tar -czf "$OUT/call3_logs.tgz" -C "$OUT" logs && rm -rf "$L"
