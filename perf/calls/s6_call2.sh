#!/bin/bash
# Session 6, device call 2 (nvidia-h200-x2, the two GPUs used apart).
# GPU 0 (issue 18 acceptance 4; issue 21 acceptance 1): the headline (t=0.6, nano-vllm's bench) of the tree before
#   the sampling work (.gpu_tree/base = a19db6a) and of the sampling branch (.gpu_tree/samp = 3483039), three runs
#   each, interleaved; then main with 10% penalized requests; then main's headline greedy and t=0.6 with ceilings.
# GPU 1 (issue 17/18/21 GPU conformance): `pytest conformance -m gpu` over all twelve goldens and the GPU sampling
#   and kernel conformance, as five processes sharing the GPU.
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
ROOT=$PWD
conf() {  # name, args...
  local n=$1; shift
  (CUDA_VISIBLE_DEVICES=1 PYTHONPATH=. timeout 500 python3 -m pytest -q -p no:cacheprovider -m gpu \
     --report "$OUT/rep_$n.json" "$@" > "$OUT/conf_$n.log" 2>&1; echo "conf $n rc=$? t=$SECONDS" >> "$OUT/conf_rc.txt") &
}
conf g1 conformance/test_golden.py --model qwen3-tiny --model qwen3-gqa4 --model qwen2-tiny
conf g2 conformance/test_golden.py --model llama3-tiny --model mistral-tiny --model qwen3-moe-tiny
conf g3 conformance/test_golden.py --model llama3-bias-hd32 --model mistral-hd64 --model qwen2-hd64
conf g4 conformance/test_golden.py --model qwen3-bias-hd32 --model qwen3-moe-unnorm-hd32 --model qwen3-tied-hd64
conf sk conformance/test_sampling.py conformance/test_kernels.py --model qwen3-tiny
bench() {  # tree, tag, args...
  local tree=$1 tag=$2; shift 2
  (cd "$tree" && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=. timeout 110 python3 -m perf.bench_engine --arch qwen3-0.6b \
     --workload headline --json "$OUT/$tag.json" --no-save "$@" > "$OUT/$tag.log" 2>&1)
  echo "$tag rc=$? t=$SECONDS: $(grep -m1 'output tok/s' "$OUT/$tag.log")  $(grep -m1 'fraction of roofline' "$OUT/$tag.log")"
}
for i in 1 2 3; do
  bench .gpu_tree/base base$i --no-ceilings
  bench .gpu_tree/samp samp$i --no-ceilings
done
bench "$ROOT" main_pen10 --no-ceilings --penalized-fraction 0.1
bench "$ROOT" main_greedy --temperature 0 --repeat 2
bench "$ROOT" main_t06 --repeat 2
wait
cat "$OUT/conf_rc.txt"
for f in "$OUT"/conf_*.log; do echo "== $f"; grep -E "passed|failed|error" "$f" | tail -3; done
