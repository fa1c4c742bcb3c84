"""The Gluon fp8 decode kernel (kernels/decode_attention_fp8.py): against the reference on a GPU; compiled for sm_90
off-GPU (its layout changes are asserted free at compile time, and its shared-memory reads are checked for bank
conflicts), so that a layout that breaks shows up without a GPU too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from nanovllm_ref.kernels import decode_attention as da
from nanovllm_ref.kernels import decode_attention_fp8 as g
from nanovllm_ref.kernels._triton_common import hopper, native_e4m3
from nanovllm_ref.kernels.decode_attention import decode_attention_reference
from nanovllm_ref.testing import RELATIVE_TOLERANCE, make_paged_batch, relative_error

from .test_kernel_fp8_kv import fp8_caches

ON_GPU = torch.cuda.is_available()
needs_gluon = pytest.mark.skipif(g.gluon is None, reason="needs triton's Gluon dialect (triton 3.6+)")
needs_gpu = pytest.mark.skipif(not (ON_GPU and native_e4m3(torch.device("cuda"))), reason="needs a CUDA GPU, sm_89+")
TILES = [{"BLOCK_N": 32, "STAGES": 3}, {"BLOCK_N": 16, "STAGES": 6}, {"BLOCK_N": 32, "STAGES": 2}]


@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"{t['BLOCK_N']}x{t['STAGES']}")
@pytest.mark.parametrize("block_size", [16, 32, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.gpu
@needs_gpu
@needs_gluon
def test_gluon_decode_matches_reference(tile, block_size, dtype):
    """Groups 1 to 8 (8 fills the MMA's columns), contexts of 0 (a CUDA graph's padded slot, first in the batch so
    that a read before its block-table row would show), 1, one short of / at / past a tile and a block, long ones;
    one split and several (partials merged by the reduce kernel)."""
    ctx = [1, 1, 15, 16, 17, 31, 32, 33, 255, 257, 1000, 4000]
    for seed, (kv_heads, group) in enumerate([(8, 2), (4, 1), (2, 4), (1, 8)]):
        b = make_paged_batch(ctx, [1] * len(ctx), num_kv_heads=kv_heads, group=group, head_dim=128,
                             block_size=block_size, dtype=dtype, device="cuda", seed=seed)
        b.seq_lens[0] = 0
        k8, v8, scales = fp8_caches(b, seed)
        ref = decode_attention_reference(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, scales)
        for splits in (1, 5):
            out = torch.full_like(b.q, float("nan"))
            da.decode_attention(b.q, k8, v8, b.block_tables, b.seq_lens, b.scale, kv_scales=scales, out=out,
                                num_splits=splits, tile_config={"GLUON": 1, **tile})
            assert out.isfinite().all() and torch.equal(out[0], torch.zeros_like(out[0]))
            assert relative_error(out, ref) < RELATIVE_TOLERANCE[dtype] * 2, (kv_heads, group, splits)


@pytest.mark.gpu
@needs_gpu
@needs_gluon
def test_fp8_decode_takes_gluon_kernel_where_it_applies(monkeypatch):
    """decode_attention sends an fp8 cache of head_dim 128 to the Gluon kernel on sm_90, and everything else (other
    GPUs, head_dim 80, groups over 8, a bf16 cache, NANOVLLM_REF_GLUON=0) to the Triton kernel."""
    taken = int(hopper(torch.device("cuda")))
    calls = []
    monkeypatch.setattr(da, "launch_fp8_decode", lambda *a, **k: calls.append(1) or g.launch_fp8_decode(*a, **k))

    def run(head_dim, group, fp8=True):
        calls.clear()
        b = make_paged_batch([40, 7], [1, 1], num_kv_heads=2, group=group, head_dim=head_dim, block_size=16,
                             dtype=torch.bfloat16, device="cuda", seed=0)
        k, v, scales = fp8_caches(b, 0) if fp8 else (b.k_cache, b.v_cache, None)
        out = da.decode_attention(b.q, k, v, b.block_tables, b.seq_lens, b.scale, kv_scales=scales)
        ref = decode_attention_reference(b.q, k, v, b.block_tables, b.seq_lens, b.scale, scales)
        assert relative_error(out, ref) < RELATIVE_TOLERANCE[torch.bfloat16] * 2
        return len(calls)

    assert run(128, 2) == taken and run(128, 8) == taken
    assert run(80, 2) == run(128, 16) == run(128, 2, fp8=False) == 0
    monkeypatch.setenv("NANOVLLM_REF_GLUON", "0")
    assert run(128, 2) == 0


def _ptxas_present() -> bool:
    import triton

    return os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas"))


needs_ptxas = pytest.mark.skipif(g.gluon is None or not _ptxas_present(), reason="needs triton's ptxas")

# Compiled in a child process: under TRITON_INTERPRET=1 (the CPU test runs) jit functions are interpreted ones.
COMPILE = """
import json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import compile as triton_compile
from triton.experimental.gluon._runtime import GluonASTSource
from nanovllm_ref.kernels import decode_attention_fp8 as g
from nanovllm_ref.kernels._triton_common import hopper, native_e4m3

def build(fn, signature, constants):
    # pointers and strides 16-byte aligned, as the launcher specializes them for a cache of head_dim 128
    sig = {n: ("constexpr" if n in constants else signature.get(n, "i32")) for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n not in constants and (n.endswith("_ptr") or n.startswith("stride_"))}
    return triton_compile(GluonASTSource(fn, sig, constants, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 1})

gl = g.gl

@g.gluon.jit
def probe(out_ptr, N: gl.constexpr):  # bank conflicts of the copies' stores and the K and V loads of the ring
    ring = gl.allocate_shared_memory(gl.float8e4nv, [N, g.D], g.RING)
    for layout in gl.static_range(3):
        if layout == 0:
            ty = gl.distributed_type(gl.float8e4nv, [N, g.D], g.COPY)
        elif layout == 1:
            ty = gl.distributed_type(gl.float8e4nv, [N, g.D], g.k_layout(N))
        else:
            ty = gl.distributed_type(gl.float8e4nv, [N, g.D], g.v_layout(N, False))
        gl.static_assert(gl.bank_conflicts(ty, ring.type) == 0)

signature = {"q_ptr": "*bf16", "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "out_ptr": "*bf16",
             "kv_scale_ptr": "*fp32", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "qk_scale": "fp32",
             "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "order_ptr": "*i32"}
results = []
for n in (16, 32):
    build(probe, {"out_ptr": "*fp32"}, {"N": n})
for constants in json.loads(sys.argv[1]):
    c = build(g.fp8_decode_split_kernel, signature, constants)
    results.append({"shared": c.metadata.shared, "ptx": c.asm["ptx"]})
print(json.dumps(results))
"""


@needs_gluon
@needs_ptxas
def test_gluon_decode_compiles_for_sm90(tmp_path):
    """The kernel builds for sm_90 (so every `assert_trivial` layout change is free) at both tile sizes, one split
    and several, page sizes 16 and 256, with the ring as its only shared memory beyond a small scratch for P and Q,
    converting by `cvt...e4m3x2` from async copies (no byte loads); and the ring is read and written without bank
    conflicts (the child's `probe` asserts it at compile time)."""
    cases = [dict(BLOCK_SIZE=bs, DIRECT_OUT=direct, HAS_ORDER=True, **tile)
             for tile, (bs, direct) in zip(TILES[:2] * 2, [(16, True), (16, True), (256, False), (256, False)])]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # Triton's cache key misses module-level layouts
    script = tmp_path / "compile_gluon_decode.py"  # jit functions need a source file
    script.write_text(COMPILE)
    done = subprocess.run([sys.executable, str(script), json.dumps(cases)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for case, result in zip(cases, json.loads(done.stdout.strip().splitlines()[-1])):
        ring = 2 * case["STAGES"] * case["BLOCK_N"] * g.HEAD_DIM
        assert ring <= result["shared"] <= ring + 2048, case
        ptx = result["ptx"]
        assert "cvt.rn.f16x2.e4m3x2" in ptx and "cp.async.cg.shared.global" in ptx and "ld.global.u8" not in ptx


@needs_gluon
def test_another_gluon_api_leaves_the_triton_kernel_serving() -> None:
    """A Gluon whose layouts do not build (another triton's API) turns the kernel off at import, not the import."""
    code = ("import triton.experimental.gluon.language as gl\n"
            "def broken(*a, **k):\n    raise TypeError('another API')\n"
            "gl.NVMMADistributedLayout = broken\n"
            "from nanovllm_ref.kernels import decode_attention, decode_attention_fp8\n"
            "assert decode_attention_fp8.gluon is None\n"
            "print('fallback')\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "fallback" in done.stdout, done.stderr[-2000:]
