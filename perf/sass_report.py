"""What the decode kernel compiles to on sm_90, without a GPU: registers, stack, shared memory, the async-copy
buffers of each load, and the instruction mix of its main loop (triton.compile for GPUTarget('cuda', 90, 32), then
the nvdisasm that Triton's package carries). Run it under the triton version of the GPU machine to see its code.

    python -m perf.sass_report --fp8 --block-n 64 --warps 2 --stages 4
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")


def _signature(fp8: bool, block_n: int, swap: bool = False) -> tuple[dict, dict, dict]:
    """The engine's call of _decode_split_kernel on the headline shape (bf16 queries, 8 KV heads, head_dim 128,
    block size 16, one split, longest-first order), as the launcher specializes it (unit strides as constants)."""
    from nanovllm_ref.kernels.decode_attention import _decode_split_kernel as kernel

    ptr, cache = "*bf16", "*fp8e4nv" if fp8 else "*bf16"
    types = [ptr, cache, cache, "*i32", "*i32", "*fp32", "*i32", ptr, "*fp32", "*fp32", "fp32"] + ["i32"] * 14
    unit = {"stride_qd", "stride_od", "stride_cd"}
    consts = dict(BLOCK_SIZE=16, BLOCK_N=block_n, BLOCK_G=8 if swap else 16, BLOCK_D=128, HEAD_DIM=128, DIRECT_OUT=True,
                  SWAP=swap, UPCAST=False, PREC="tf32", HAS_ORDER=True, FP8=fp8, F16_DOTS=fp8, V_PTX=fp8,
                  **{n: 1 for n in unit})
    names = kernel.arg_names
    signature = {n: ("constexpr" if n in consts else t) for n, t in zip(names, types + ["constexpr"] * 13)}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n not in consts and not n.startswith(("qk_scale", "group", "num_"))}
    return signature, consts, attrs


def compile_decode(fp8: bool, block_n: int, warps: int, stages: int, maxnreg: int | None = None,
                   swap: bool = False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from nanovllm_ref.kernels.decode_attention import _decode_split_kernel as kernel

    signature, consts, attrs = _signature(fp8, block_n, swap)
    src = ASTSource(kernel, signature, consts, attrs)
    options = dict(num_warps=warps, num_stages=stages, maxnreg=maxnreg)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def report(compiled) -> dict:
    """Resource usage, async-copy buffers, and the op counts of the first backward-branching loop (the full tiles)."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True).stdout
    lines = sass.splitlines()
    loop: collections.Counter = collections.Counter()
    for i, line in enumerate(lines):
        m = re.search(r"@!?P\d BRA `\((\.L_x_\d+)\)", line)
        start = next((j for j, x in enumerate(lines) if m and x.startswith(m.group(1) + ":")), None)
        if start is not None and start < i:
            loop.update(op.group(1) for x in lines[start:i] if (op := OP.search(x)))
            break
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    buffers = re.findall(r"local_alloc : \(\) -> !ttg.memdesc<([0-9x]+\w+)", compiled.asm["ttgir"])
    return {"registers": int(regs.group(1)) if regs else None, "stack_bytes": int(stack.group(1)) if stack else None,
            "shared_bytes": compiled.metadata.shared, "async_buffers": buffers,
            "loop_instructions": sum(loop.values()), "loop_ops": dict(loop.most_common(16))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.sass_report", description=__doc__.splitlines()[0])
    p.add_argument("--fp8", action="store_true", help="the fp8-cache kernel (default: bf16 cache)")
    p.add_argument("--block-n", type=int, default=64)
    p.add_argument("--warps", type=int, default=2)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--maxnreg", type=int, default=None, help="at most this many registers per thread")
    p.add_argument("--swap", action="store_true", help="transposed products (attend_tile's SWAP)")
    a = p.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    for key, value in report(compile_decode(a.fp8, a.block_n, a.warps, a.stages, a.maxnreg, a.swap)).items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
