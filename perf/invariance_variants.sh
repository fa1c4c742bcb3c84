#!/usr/bin/env bash
# Localize a failure of the exact invariance module on one GPU: the module on Qwen3-0.6B's shape (random weights) in
# batch_invariant mode, side by side, once per variant of the mode, each on its own copy of this tree (the tree itself
# is not touched). Variants: cur (as is), nosplit (no split of K in kernels/invariant_gemm.json), fallback (no table:
# the default tiles), qkv64 (the qkv tile before the per-layer table's last sweep), sync (no async scheduling, no CUDA
# graphs), nodec (decode-only steps through the prefill kernel, as before the decode-only path).
# Usage: [K=pytest -k expression, default "budget-48"] [TRIALS=2] bash perf/invariance_variants.sh LOGS
set -u
L=${1:?logs folder}; mkdir -p "$L"; R=$PWD; P=${PYTHON:-python3}; K=${K:-budget-48}; TRIALS=${TRIALS:-2}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
Q=/tmp/qwen3-0.6b-random  # the name seeds the module's compositions: the same as perf/batch_invariant_gpu.sh's
PYTHONPATH=$R $P -c "from nanovllm_ref.testing.bench.models import write_config; write_config('qwen3-0.6b', '$Q')"
J=nanovllm_ref/kernels/invariant_gemm.json
copy() {  # links (a golden/ linked in) are copied as what they point to
  rm -rf "/tmp/variant_$1"; mkdir "/tmp/variant_$1"
  tar -C "$R" -chf - --exclude=./.git --exclude=./.nox --exclude=__pycache__ . | tar -xf - -C "/tmp/variant_$1"; }
edit_json() { $P -c "import json,sys; p=sys.argv[1]; t=json.load(open(p)); exec(sys.argv[2]); json.dump(t, open(p, 'w'))" "$@"; }
copy cur
copy nosplit; edit_json "/tmp/variant_nosplit/$J" "for k in t: t[k][6] = 1"
copy fallback; echo '{}' > "/tmp/variant_fallback/$J"
copy qkv64; edit_json "/tmp/variant_qkv64/$J" "t['4096,1024'] = [64, 64, 64, 8, 4, 4, 1]"
copy sync
copy nodec; sed -i 's/            if meta.decode_only:  # the decode kernel unsplit/            if False:  #/' \
  /tmp/variant_nodec/nanovllm_ref/attention/triton_backend.py
grep -q "if False:" /tmp/variant_nodec/nanovllm_ref/attention/triton_backend.py || echo "nodec: the edit did not apply"
for v in cur nosplit fallback qkv64 sync nodec; do
  extra=(); [ "$v" = sync ] && extra=(--engine-arg async_scheduling=false --engine-arg enforce_eager=true)
  (cd "/tmp/variant_$v" && PYTHONPATH=$PWD timeout "${VARIANT_TIMEOUT_S:-120}" $P -m pytest -q -p no:cacheprovider -rfE \
     --dtype bfloat16 --engine-arg device=cuda --report /dev/null conformance/test_batch_invariance.py --invariance exact \
     --invariance-trials "$TRIALS" --model $Q --reference none --engine-arg load_format=dummy \
     --engine-arg gpu_memory_utilization=0.08 --engine-arg batch_invariant=true "${extra[@]}" -k "$K" > "$L/$v.log" 2>&1
   echo "rc=$?" >> "$L/$v.log") &
done
wait
for v in cur nosplit fallback qkv64 sync nodec; do echo "== $v"; grep -E "passed|failed|FAIL:|rc=" "$L/$v.log" | cut -c1-240 | tail -4; done
