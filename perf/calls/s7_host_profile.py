"""Session 7 probe: the host's time per function over one greedy headline run on the GPU (cProfile).

The run is device bound except at the prefill steps and in the tail (perf/RESULTS.md, call 5); this shows which
host functions make up the per-step cost there. cProfile slows Python code ~1.5-2x, so read shares, not times.

    python3 perf/calls/s7_host_profile.py [--tail N]   # --tail: N requests of 1,024 output tokens (a tail-like run)
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import pstats
import sys

sys.path.insert(0, ".")
from perf import workloads  # noqa: E402
from perf.engine_runner import build_llm, run_throughput, warmup  # noqa: E402


def main() -> None:
    llm = build_llm("qwen3-0.6b")
    warmup(llm)
    if "--tail" in sys.argv:
        n = int(sys.argv[sys.argv.index("--tail") + 1])
        work = workloads.uniform(n, 128, 1024)
    else:
        work = workloads.headline()
    work = dataclasses.replace(work, temperature=0.0)
    run_throughput(llm, work)
    prof = cProfile.Profile()
    prof.enable()
    res = run_throughput(llm, work)
    prof.disable()
    print(f"{work.name}: {res.wall_s:.2f} s, {res.output_tokens / res.wall_s:,.0f} tok/s, {res.steps} steps")
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(35)
        print(buf.getvalue()[-9000:])


if __name__ == "__main__":
    main()
