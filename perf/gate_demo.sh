#!/usr/bin/env bash
# Demonstrates that the perf regression gate trips on a deliberately slowed kernel.
#
#   perf/gate_demo.sh          # GPU: decode-attention benchmarks, slowed with NANOVLLM_REF_SLOW_KERNELS=1
#   perf/gate_demo.sh --cpu    # CPU: host-overhead benchmark, slowed with NANOVLLM_REF_PERF_SLOW_HOST=1
#   GATE=median:5% perf/gate_demo.sh   # another --benchmark-compare-fail expression
#
# The GPU gate is median:10% (what CI runs). The CPU variant defaults to min:10%: on a shared CPU other
# processes inflate the median by more than 10% from run to run, while the minimum stays put.
# Steps, in a throw-away storage folder (perf/baselines is left alone):
#   1. save a baseline                        (pytest ... --benchmark-save=gate_base)
#   2. control: rerun unchanged and compare   (must pass --benchmark-compare-fail="$GATE")
#   3. rerun with the slow-down and compare   (must fail with "Performance has regressed")
# Prints "gate demo: PASS" (exit 0) when 2 passes and 3 trips the gate, else "gate demo: FAIL" (exit 1).
set -u
cd "$(dirname "$0")/.."

MODE=gpu
GATE_GPU=${GATE:-median:10%}
GATE_CPU=${GATE:-min:10%}
[[ "${1:-}" == "--cpu" ]] && MODE=cpu
if [[ $MODE == gpu ]]; then
  if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU here: run 'perf/gate_demo.sh --cpu' for the CPU variant"; exit 2
  fi
  SELECT=(perf/test_kernels.py -k "test_decode_attention and not smoke")
  SLOW=NANOVLLM_REF_SLOW_KERNELS
  GATE=$GATE_GPU
else
  SELECT=(perf/test_host_overhead.py -k test_decode_step_256)
  SLOW=NANOVLLM_REF_PERF_SLOW_HOST
  GATE=$GATE_CPU
fi

STORE=$(mktemp -d)
trap 'rm -rf "$STORE"' EXIT
COMMON=(-q -p no:cacheprovider --benchmark-storage="file://$STORE" --benchmark-columns=min,median,max)
LOG="$STORE/log.txt"

echo "== 1. baseline ($MODE)"
if ! env "$SLOW=0" python3 -m pytest "${SELECT[@]}" "${COMMON[@]}" --benchmark-save=gate_base; then
  echo "gate demo: FAIL (the baseline run failed)"; exit 1
fi

echo "== 2. control: unchanged code vs the baseline, $GATE"
env "$SLOW=0" python3 -m pytest "${SELECT[@]}" "${COMMON[@]}" --benchmark-compare=0001 \
  --benchmark-compare-fail="$GATE" >"$LOG" 2>&1
control=$?
grep -E "^test_|\(NOW\)|\(0001|RegressionCheck|passed|failed" "$LOG" | head -n 30

echo "== 3. $SLOW=1 vs the baseline, $GATE"
env "$SLOW=1" python3 -m pytest "${SELECT[@]}" "${COMMON[@]}" --benchmark-compare=0001 \
  --benchmark-compare-fail="$GATE" >"$LOG" 2>&1
slowed=$?
grep -E "^test_|\(NOW\)|\(0001|RegressionCheck" "$LOG" | head -n 30 || tail -n 25 "$LOG"
tripped=0
if [[ $slowed -ne 0 ]] && grep -q "Performance has regressed" "$LOG"; then tripped=1; fi

echo
echo "control run exit code: $control (want 0); slowed run exit code: $slowed (want non-zero, regression reported)"
if [[ $control -eq 0 && $tripped -eq 1 ]]; then
  echo "gate demo: PASS"; exit 0
fi
[[ $control -ne 0 ]] && echo "the control run failed the gate: timings are noisier than 10% here"
[[ $tripped -ne 1 ]] && echo "the slowed run did not trip the gate: the slow-down is smaller than 10%"
echo "gate demo: FAIL"; exit 1
