"""Why a decode-attention tile runs as fast as it does: Nsight Compute's counters for the engine's kernel on one
headline decode step (one GPU call; `ncu` on the PATH).

For each tile (perf/fp8_decode_sweep.py's `[bf16:]BLOCK_N/warps/stages[/rN][/s]`), this script runs itself under
`ncu --clock-control none` (the GPU's own clocks, as the engine sees them), profiles the third launch of the split
kernel (the first two compile and warm up) and prints the figures that say what bounds it: time, DRAM throughput,
registers and shared memory per program, the resident warps they allow, the warp stall reasons (cycles per issued
instruction) and the shared-memory bank conflicts.

    python -m perf.ncu_decode --step 0 --tiles 32/1/8/s bf16:64/2/4
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys

STALLS = ("long_scoreboard", "short_scoreboard", "wait", "barrier", "mio_throttle", "lg_throttle", "math_pipe_throttle",
          "not_selected", "selected", "dispatch_stall", "no_instruction", "branch_resolving")
SHOWN = ("Duration", "DRAM Throughput", "SM Frequency", "Registers Per Thread", "Dynamic Shared Memory Per Block",
         "Block Limit Registers", "Block Limit Shared Mem", "Achieved Active Warps Per SM",
         "Eligible Warps Per Scheduler", "Issue Slots Busy")
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"  # .format(a STALLS entry)
# shared-memory bank conflicts and wavefronts, .format("st") for stores, .format("ld") for loads
CONFLICTS, WAVEFRONTS = ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{}.sum",
                         "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{}.sum")


def child(step: int, tile: str) -> None:
    """The profiled process: three calls of the engine's decode kernel at `tile` on headline decode step `step`."""
    import torch

    from nanovllm_ref.kernels.decode_attention import decode_attention

    from .fp8_decode_sweep import headline_step, parse_tile

    q, bf, f8, scales, tables, seq_lens, order = headline_step(step)
    fp8, cfg = parse_tile(tile)
    for _ in range(3):
        decode_attention(q, *(f8 if fp8 else bf), tables, seq_lens, 128**-0.5, kv_scales=scales if fp8 else None,
                         order=order, num_splits=1, tile_config=cfg)
    torch.cuda.synchronize()


def profile(step: int, tile: str) -> dict[str, str]:
    metrics = [STALL.format(s) for s in STALLS] + [m.format(op) for op in ("st", "ld") for m in (CONFLICTS, WAVEFRONTS)]
    cmd = ["ncu", "--clock-control", "none", "--kernel-name", "regex:_decode_split", "--launch-skip", "2",
           "--launch-count", "1", "--section", "SpeedOfLight", "--section", "LaunchStats", "--section", "Occupancy",
           "--section", "SchedulerStats", "--section", "ComputeWorkloadAnalysis", "--metrics", ",".join(metrics),
           "--csv", "--page", "details", sys.executable, "-m", "perf.ncu_decode", "--child", "--step", str(step),
           "--tiles", tile]
    return parse_details(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def parse_details(out: str) -> dict[str, str]:
    """`ncu --csv --page details` output (after its ==PROF== lines) -> {metric name: "value unit"}."""
    rows = csv.DictReader(io.StringIO(out[out.index('"ID"'):]))
    return {r["Metric Name"]: f"{r['Metric Value']} {r['Metric Unit']}".strip() for r in rows}


def _number(value: str) -> float:
    """ncu's printed value ("1,234.5 cycle") as a float."""
    return float(value.split()[0].replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.ncu_decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--step", type=int, default=0, help="headline decode step (0: 256 sequences)")
    p.add_argument("--tiles", nargs="+", default=["32/1/8/s"])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a.step, a.tiles[0])
        return 0
    for tile in a.tiles:
        m = profile(a.step, tile)
        print(f"== step {a.step} tile {tile}")
        for name in SHOWN:
            print(f"  {name:34s} {m.get(name, '?')}")
        stalls = {s: _number(m.get(STALL.format(s), "0")) for s in STALLS}
        print("  stalls (cycles per issue): " + ", ".join(f"{s} {v:.2f}" for s, v in stalls.items() if v >= 0.05))
        for op in ("st", "ld"):
            print(f"  shared {'stores' if op == 'st' else 'loads '}: {m.get(WAVEFRONTS.format(op), '?')} wavefronts, "
                  f"{m.get(CONFLICTS.format(op), '?')} of them bank conflicts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
