#!/bin/bash
# Device call 5 (issue 21): the breakdown before (../.before_tree = main 6333fdf + this perf/profile_step.py) and
# after (this tree), with the decode window free of per-step synchronizes (calls 1-4 synced before every step).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
(cd ../.before_tree && PYTHONPATH=. timeout 58 python3 -m perf.profile_step --temperature 0 \
  --json "$OUT/before5.json") > "$OUT/before5.log" 2>&1
timeout 58 python3 -m perf.profile_step --temperature 0 --json "$OUT/after5.json" > "$OUT/after5.log" 2>&1
for f in before5 after5; do echo "== $f"; grep -A13 "^step 0" "$OUT/$f.log"; grep -A14 "steady decode" "$OUT/$f.log";
  grep -A12 "host phase" "$OUT/$f.log"; done
