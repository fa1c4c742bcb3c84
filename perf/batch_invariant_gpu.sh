#!/usr/bin/env bash
# The batch-invariant mode on one GPU, in one run (logs into $1, default $OUT):
#   1. the GEMM tile sweep (perf/invariant_tile.py; NO_SWEEP=1 skips it), against the tiles in kernels/matmul.py;
#   2. the headline, default mode then batch-invariant mode, PAIRS times (default 1) interleaved (one engine at a
#      time, nothing else on the GPU), and the ratio of their means;
#   3. side by side (small KV budgets): the exact invariance module in batch-invariant mode on every golden and on
#      Qwen3-0.6B's shape with random weights (20 compositions), the same in default mode (expected to fail), and
#      the self-consistency module (--reference none) on Qwen3-0.6B in both modes and on every golden, every golden
#      against its bf16 goldens in batch-invariant mode, and the GPU column of the batch-invariance mutants.
# NO_GOLDENS=1 runs step 3 on Qwen3-0.6B's shape only.
# Usage: [TOTAL_S=N] [NO_SWEEP=1] [NO_GOLDENS=1] [PAIRS=N] bash perf/batch_invariant_gpu.sh [LOGS] [TRIALS] [CONFORMANCE_TIMEOUT_S]
set -u
L=${1:-${OUT:-/tmp/batch_invariant}}; TRIALS=${2:-20}; CT=${3:-180}
mkdir -p "$L/logs"; P=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
[ -z "${NO_SWEEP:-}" ] && $P -m perf.invariant_tile --json "$L/logs/tile.json" > "$L/logs/tile.log" 2>&1
# each run saved to its --json file only (--no-save would drop it)
B="$P -m nanovllm_ref.testing.bench --arch qwen3-0.6b --workload headline --temperature 0 --repeat 1 --no-progress --no-ceilings"
for i in $(seq "${PAIRS:-1}"); do  # interleaved: default, invariant, default, invariant, ...
  $B --json "$L/logs/headline_default_$i.json" > "$L/logs/headline_default_$i.log" 2>&1
  $B --batch-invariant --json "$L/logs/headline_invariant_$i.json" > "$L/logs/headline_invariant_$i.log" 2>&1
done
$P - "$L/logs" > "$L/logs/headline_ratio.log" 2>&1 <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
tok = {f.stem: json.loads(f.read_text())["throughput"]["output_tok_s"] for f in sorted(d.glob("headline_*.json"))}
for name, value in tok.items():
    print(f"{name}: {value:,.0f} output tok/s")
inv = [v for n, v in tok.items() if "invariant" in n]
dflt = [v for n, v in tok.items() if "default" in n]
if inv and dflt:
    print(f"ratio: invariant / default = {sum(inv) / len(inv):,.0f} / {sum(dflt) / len(dflt):,.0f}"
          f" = {sum(inv) / sum(dflt) * len(dflt) / len(inv):.1%} (means of {len(inv)} and {len(dflt)} runs)")
PY
Q=/tmp/qwen3-0.6b-random; $P -c "from nanovllm_ref.testing.bench.models import write_config; write_config('qwen3-0.6b', '$Q')"
C="$P -m pytest -q -p no:cacheprovider -rfE --dtype bfloat16 --engine-arg device=cuda --report /dev/null"
INV="conformance/test_batch_invariance.py --invariance exact --invariance-trials $TRIALS"
# max_model_len 4096 as the headline: the checkpoint's 40,960 needs more than 8% of an 80 GB card
Q6="--model $Q --reference none --engine-arg load_format=dummy --engine-arg gpu_memory_utilization=0.08 --engine-arg max_model_len=4096"
export OMP_NUM_THREADS=1  # about twenty processes side by side on 16 cores
END=$((SECONDS + CT))  # every run of the side-by-side phase ends by then (rc=124: cut off), and the whole
[ -n "${TOTAL_S:-}" ] && [ "$END" -gt "$TOTAL_S" ] && END=$TOTAL_S  # script by TOTAL_S, when set
CT=$((END - SECONDS))
run() { local name=$1; shift; timeout $((END - SECONDS > 1 ? END - SECONDS : 1)) "$@" > "$L/logs/$name.log" 2>&1
        echo "rc=$?" >> "$L/logs/$name.log"; }
GOLDENS=$([ -n "${NO_GOLDENS:-}" ] || $P -c "import json;print(' '.join(sorted(json.load(open('golden/manifest.json'))['checkpoints'])))")
for m in $GOLDENS; do
  G="--model $m --engine-arg gpu_memory_utilization=0.025"
  (run "golden_$m" $P -m pytest -q -p no:cacheprovider -rfE -m gpu conformance/test_golden.py $G \
     --engine-arg batch_invariant=true --report /dev/null;
   run "sc_$m" $C conformance/test_self_consistency.py $G --reference none;
   run "inv_$m" $C $INV $G --engine-arg batch_invariant=true --reference none) &
done
run inv_qwen3-0.6b $C $INV $Q6 --engine-arg batch_invariant=true -k "not budget" &
run inv_budget_qwen3-0.6b $C $INV $Q6 --engine-arg batch_invariant=true -k "budget and not cached" &
run inv_budget_cached_qwen3-0.6b $C $INV $Q6 --engine-arg batch_invariant=true -k "budget and cached" &
(run default_qwen3-0.6b $C $INV $Q6 --invariance-trials 3 -x; run sc_qwen3-0.6b $C conformance/test_self_consistency.py $Q6;
 run sc_inv_qwen3-0.6b $C conformance/test_self_consistency.py $Q6 --engine-arg batch_invariant=true -s) &
[ -z "${NO_GOLDENS:-}" ] && run default_qwen3-tiny $C $INV --invariance-trials 3 -x --model qwen3-tiny --engine-arg gpu_memory_utilization=0.025 &
[ -z "${NO_GOLDENS:-}" ] && run mutants_gpu $P -m tools.mutants --gpu --only batch-invariant --jobs 3 --timeout $((CT - 15)) --budget $((CT - 10)) \
  --out "$L/logs/mutants_gpu" &
wait
for f in "$L"/logs/*.log; do echo "== $(basename "$f")"; grep -E "passed|failed|error|rc=|tile|best|ratio|output tok/s|mean k3|caught|survived" "$f" | tail -6; done \
  > "$L/summary.txt"
tar -czf "$L/logs.tar.gz" -C "$L" logs && rm -rf "$L/logs"
cat "$L/summary.txt"
