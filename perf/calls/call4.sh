#!/bin/bash
# Device call 4 (issue 21): host time per phase of the steady decode loop (tree of call 3 + the tool's phases).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 150 python3 -m perf.profile_step --temperature 0 --throughput 0 --json "$OUT/phases.json" > "$OUT/phases.log" 2>&1
grep -B2 -A16 "host phase" "$OUT/phases.log"; grep headline "$OUT/phases.log"; tail -3 "$OUT/phases.log"
