#!/usr/bin/env bash
# Demonstrates that the perf regression gates trip on a deliberately slowed kernel.
#
#   perf/gate_demo.sh          # GPU: decode-attention benchmarks, slowed with NANOVLLM_REF_SLOW_KERNELS=1:
#                              #      the device-time gate, then the wall-time gate
#   perf/gate_demo.sh --cpu    # CPU: host-overhead benchmark, slowed with NANOVLLM_REF_PERF_SLOW_HOST=1 (wall gate:
#                              #      it has no device time)
#   EVENT=5 GATE=median:5% perf/gate_demo.sh   # other limits
#
# GPU gates: --event-compare-fail=10 (CUDA-event time per call in extra_info, perf/event_gate.py; what CI runs on
# kernels) and --benchmark-compare-fail=median:10% (pytest-benchmark's wall time of a round), each alone. The CPU
# variant defaults to min:10%: on a shared CPU other processes inflate the median by more than 10% from run to
# run, while the minimum stays put.
# Steps, in a throw-away storage folder (perf/baselines is left alone):
#   1. save a baseline                        (pytest ... --benchmark-save=gate_base)
#   and for each gate:
#   2. control: rerun unchanged and compare   (must pass the gate)
#   3. rerun with the slow-down and compare   (must fail, with the gate's report: "device-time gate FAILED" or
#                                              "Performance has regressed")
# Prints "gate demo: PASS" (exit 0) when every control passes and every slowed run trips its gate, else
# "gate demo: FAIL" (exit 1).
set -u
cd "$(dirname "$0")/.."

MODE=gpu
[[ "${1:-}" == "--cpu" ]] && MODE=cpu
if [[ $MODE == gpu ]]; then
  if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA GPU here: run 'perf/gate_demo.sh --cpu' for the CPU variant"; exit 2
  fi
  SELECT=(perf/test_kernels.py -k "test_decode_attention and not smoke")
  SLOW=NANOVLLM_REF_SLOW_KERNELS
  GATES=("--event-compare-fail=${EVENT:-10}" "--benchmark-compare-fail=${GATE:-median:10%}")
else
  SELECT=(perf/test_host_overhead.py -k test_decode_step_256)
  SLOW=NANOVLLM_REF_PERF_SLOW_HOST
  GATES=("--benchmark-compare-fail=${GATE:-min:10%}")
fi

STORE=$(mktemp -d)
trap 'rm -rf "$STORE"' EXIT
COMMON=(-q -p no:cacheprovider --benchmark-storage="file://$STORE" --benchmark-columns=min,median,max)
LOG="$STORE/log.txt"
SHOW="^test_|\(NOW\)|\(0001|RegressionCheck|REGRESSED|^ok |device-time gate|passed|failed"

run() {  # $1: the slow-down switch (0 or 1), $2: the gate option; the log goes to $LOG
  env "$SLOW=$1" python3 -m pytest "${SELECT[@]}" "${COMMON[@]}" --benchmark-compare=0001 "$2" >"$LOG" 2>&1
}

demo() {  # $1: the gate option; returns 0 when its control passes and the slowed run trips it
  local gate=$1 trip="Performance has regressed" control slowed
  [[ $gate == --event-compare-fail=* ]] && trip="device-time gate FAILED"
  echo "== 2. control: unchanged code vs the baseline, $gate"
  run 0 "$gate"; control=$?
  grep -E "$SHOW" "$LOG" | head -n 40
  echo "== 3. $SLOW=1 vs the baseline, $gate"
  run 1 "$gate"; slowed=$?
  grep -E "$SHOW" "$LOG" | head -n 40 || tail -n 25 "$LOG"
  echo "$gate: control exit code $control (want 0); slowed exit code $slowed (want non-zero, \"$trip\")"
  if [[ $control -ne 0 ]]; then
    echo "the control run failed the gate: timings are noisier than the limit here"; return 1
  fi
  if [[ $slowed -eq 0 ]] || ! grep -q "$trip" "$LOG"; then
    echo "the slowed run did not trip the gate: the slow-down is smaller than the limit"; return 1
  fi
}

echo "== 1. baseline ($MODE)"
if ! env "$SLOW=0" python3 -m pytest "${SELECT[@]}" "${COMMON[@]}" --benchmark-save=gate_base; then
  echo "gate demo: FAIL (the baseline run failed)"; exit 1
fi
result=0
for gate in "${GATES[@]}"; do
  echo
  demo "$gate" || result=1
done
echo
[[ $result -eq 0 ]] && echo "gate demo: PASS" || echo "gate demo: FAIL"
exit $result
