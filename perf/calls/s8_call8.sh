#!/bin/bash
# Session 8, call 8 (nvidia-h200): the headline on the final engine with its results saved as JSON (perf/results/,
# read by perf.report for perf/plots/): greedy (ceilings, 3 runs) and t=0.6 (3 runs).
# (The first run of this script copied every JSON of perf/results and lost the new ones to the $OUT file cap.)
export PYTHONUNBUFFERED=1 PYTHONPATH=.
for args in "--temperature 0 --repeat 3" "--repeat 3"; do
  timeout 150 python3 -m perf.bench_engine --arch qwen3-0.6b --workload headline $args > "$OUT/bench.log" 2>&1
  echo "bench $args rc=$? t=$SECONDS: $(grep -E 'ceilings|run [0-9]/|fraction of roofline|saved' "$OUT/bench.log" | tr -s ' ' | tr '\n' ' ')"
done
# only the runs made here (the tree's own results are tracked); one tarball: few files come back from $OUT
git ls-files perf/results > /tmp/tracked.txt 2>/dev/null || true
ls perf/results/*_engine_*.json | grep -vxFf /tmp/tracked.txt | grep 20261201 > /tmp/new.txt
tar -czf "$OUT/results.tgz" -T /tmp/new.txt; cat /tmp/new.txt
