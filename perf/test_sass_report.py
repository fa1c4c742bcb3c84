"""perf/sass_report.py compiles the engine's decode kernel for sm_90 on a machine without a GPU and reads its loop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tools_present() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return os.path.isfile(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm"))


@pytest.mark.skipif(not _tools_present(), reason="triton with its NVIDIA backend tools (ptxas, nvdisasm) is needed")
@pytest.mark.parametrize("fp8, swap", [(False, False), (True, False), (True, True)])
def test_reports_the_decode_kernels_loop(fp8: bool, swap: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled, not interpreted
    args = [sys.executable, "-m", "perf.sass_report", "--block-n", "32", "--warps", "2", "--stages", "2"]
    args += (["--fp8"] if fp8 else []) + (["--swap"] if swap else [])
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    fields = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert 0 < int(fields["registers"]) <= 255 and int(fields["loop_instructions"]) > 0
    assert "HMMA" in fields["loop_ops"]  # both products on tensor cores
    assert ("E4M3" in fields["loop_ops"]) == fp8  # the fp8 cache is converted in the loop, the bf16 one is not
    assert ("f8E4M3FN" in fields["async_buffers"]) == fp8
