# Shared by the device-call scripts (perf/calls/*.sh): `source "$(dirname "$0")/lib.sh"` after setting L, the log
# folder under $OUT.

# bench TREE TAG ARGS...: the headline through perf.bench_engine run in TREE, its log in $L/TAG.log; prints a line
bench() {
  local tree=$1 tag=$2; shift 2
  (cd "$tree" && PYTHONPATH=. timeout 150 python3 -m perf.bench_engine --arch qwen3-0.6b --workload headline \
     --no-save --json "$L/$tag.json" "$@" > "$L/$tag.log" 2>&1)
  echo "$tag rc=$? t=$SECONDS: $(grep -E 'run [0-9]/|fraction of roofline' "$L/$tag.log" | tr -s ' ' | tr '\n' ' ')"
}

# pytest_bg NAME LIMIT ARGS...: one pytest process in the background, its log in $L/NAME.log, its rc in $L/rc.txt
pytest_bg() {
  local name=$1 limit=$2; shift 2
  (timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rfE "$@" > "$L/$name.log" 2>&1
   echo "$name rc=$? t=$SECONDS" >> "$L/rc.txt") &
}

# gpu_pytest NAME LIMIT ARGS...: pytest_bg of the `gpu`-marked tests only
gpu_pytest() {
  local name=$1 limit=$2; shift 2
  pytest_bg "$name" "$limit" -m gpu "$@"
}

# the twelve golden checkpoints (golden/manifest.json)
GOLDENS=(qwen3-tiny qwen3-gqa4 qwen2-tiny llama3-tiny mistral-tiny qwen3-moe-tiny qwen3-tied-hd64 qwen3-bias-hd32
         qwen2-hd64 llama3-bias-hd32 mistral-hd64 qwen3-moe-unnorm-hd32)
