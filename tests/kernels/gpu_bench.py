#!/usr/bin/env python3
"""GPU benchmark of the Triton kernels against the device's copy bandwidth: `python3 tests/kernels/gpu_bench.py`.

1. Copy bandwidth: a 4 GiB device-to-device copy, bytes read + written, median of 10 (CUDA events).
2. store_kv, decode_attention, prefill_attention at serving shapes, timed with `triton.testing.do_bench`
   (median; it also flushes L2 with a 256 MB write before every timed call, so nothing is served from the
   50 MB L2; the decode caches are 0.25-4 GiB anyway, and store_kv rotates over 4 input sets / cache regions).
   Memory-bound kernels print achieved GB/s (every KV byte read once, q and out once; store_kv: K/V read once
   and written once) and the fraction of the copy bandwidth; prefill prints TFLOP/s (causal FLOPs only).
3. Every timed shape is checked against its reference (relative error, bf16 tolerance 1e-2).

Options: `--sweep` also sweeps decode tile configs (BLOCK_N, num_stages, num_splits) at batch 64 / context
4096; `--json PATH` writes the results. `NANOVLLM_REF_SLOW_KERNELS=1` makes decode deliberately slower (half
BLOCK_N, no pipelining) to prove a regression gate trips. Exit status 1 if a correctness check fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere without installing

import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from nanovllm_ref.kernels.decode_attention import decode_attention, decode_attention_reference  # noqa: E402
from nanovllm_ref.kernels.prefill_attention import prefill_attention, prefill_attention_reference  # noqa: E402
from nanovllm_ref.kernels.store_kv import store_kv, store_kv_reference  # noqa: E402
from nanovllm_ref.testing import make_paged_batch, relative_error  # noqa: E402

DT = torch.bfloat16
TOL = 1e-2
results: list[dict] = []
failures: list[str] = []


def median_ms(fn) -> float:
    try:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    except TypeError:  # older triton without return_mode
        return do_bench(fn, warmup=25, rep=100, quantiles=[0.5])


def copy_bandwidth() -> float:
    n = 4 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(times) / 1e9  # GB/s, read + write


def _free():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def report(kind: str, name: str, ms: float, err: float, copy_gbs: float, nbytes: float = 0, flops: float = 0):
    ok = err < TOL
    row = {"kernel": kind, "shape": name, "ms": ms, "rel_err": err, "ok": ok}
    line = f"{kind:8s} {name:46s} {ms * 1e3:9.1f} us"
    if nbytes:
        gbs = nbytes / (ms / 1e3) / 1e9
        row.update(gbs=gbs, frac_copy=gbs / copy_gbs)
        line += f" {gbs:8.0f} GB/s {gbs / copy_gbs:6.1%} of copy"
    if flops:
        tfs = flops / (ms / 1e3) / 1e12
        row.update(tflops=tfs)
        line += f" {tfs:7.1f} TFLOP/s"
    line += f"  err {err:.1e} {'ok' if ok else 'FAIL'}"
    print(line, flush=True)
    results.append(row)
    if not ok:
        failures.append(f"{kind} {name}: rel err {err:.2e}")


def bench_store_kv(copy_gbs: float, tokens: int = 16384, kvh: int = 8, d: int = 128, bs: int = 16):
    rot = 4  # 4 input sets, each writing a different region of a 4x larger cache
    b = make_paged_batch([tokens * rot], [tokens * rot], num_kv_heads=kvh, group=1, head_dim=d, block_size=bs,
                         dtype=DT, device="cuda", seed=0, num_pad=0)
    k, v = b.poisoned_caches()
    chunk = lambda t, i: t[i * tokens : (i + 1) * tokens]  # noqa: E731
    sets = [(chunk(b.key, i), chunk(b.value, i), chunk(b.slot_mapping, i)) for i in range(rot)]
    it = iter(range(1 << 62))
    ms = median_ms(lambda: _store_rot(sets, k, v, it))
    for key, value, slots in sets:
        store_kv(key, value, k, v, slots)
    k_ref, v_ref = b.poisoned_caches()
    for key, value, slots in sets:
        store_kv_reference(key, value, k_ref, v_ref, slots)
    same = lambda x, y: bool(((x == y) | (x.isnan() & y.isnan())).all())  # noqa: E731  (bitwise, NaN == NaN)
    err = 0.0 if same(k, k_ref) and same(v, v_ref) else float("inf")
    nbytes = 2 * 2 * tokens * kvh * d * DT.itemsize  # K and V, read once + written once
    report("store_kv", f"tokens={tokens} kvh={kvh} d={d} bs={bs}", ms, err, copy_gbs, nbytes=nbytes)


def _store_rot(sets, k, v, it):
    key, value, slots = sets[next(it) % len(sets)]
    store_kv(key, value, k, v, slots)


def bench_decode(copy_gbs: float, batch: int, ctx: int, heads: int, kvh: int, bs: int, d: int = 128,
                 tile_config=None, num_splits=None, label: str = ""):
    b = make_paged_batch([ctx] * batch, [1] * batch, num_kv_heads=kvh, group=heads // kvh, head_dim=d,
                         block_size=bs, dtype=DT, device="cuda", seed=batch + ctx + bs, extra_columns=0)
    args = (b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.scale)
    kw = dict(tile_config=tile_config, num_splits=num_splits)
    out = decode_attention(*args, **kw)
    err = relative_error(out, decode_attention_reference(*args))
    ms = median_ms(lambda: decode_attention(*args, **kw))
    nbytes = 2 * batch * ctx * kvh * d * DT.itemsize + 2 * b.q.numel() * DT.itemsize
    name = f"b={batch} ctx={ctx} h={heads}/{kvh} d={d} bs={bs}{label}"
    report("decode", name, ms, err, copy_gbs, nbytes=nbytes)


def bench_prefill(copy_gbs: float, ctx: list[int], qlen: list[int], heads: int, kvh: int, bs: int, d: int = 128):
    b = make_paged_batch(ctx, qlen, num_kv_heads=kvh, group=heads // kvh, head_dim=d, block_size=bs,
                         dtype=DT, device="cuda", seed=sum(ctx))
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, b.scale)
    mql = max(qlen)
    out = prefill_attention(*args, mql)
    err = relative_error(out, prefill_attention_reference(*args))
    ms = median_ms(lambda: prefill_attention(*args, mql))
    visible = sum(q * (c - q) + q * (q + 1) // 2 for c, q in zip(ctx, qlen))  # causal (query, key) pairs
    flops = 4 * d * heads * visible
    name = f"{len(ctx)}x(ctx={ctx[0]},q={qlen[0]}) h={heads}/{kvh} d={d} bs={bs}"
    report("prefill", name, ms, err, copy_gbs, flops=flops)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="also sweep decode tile configs")
    parser.add_argument("--json", type=str, default=None, help="write results to this file")
    a = parser.parse_args()
    assert torch.cuda.is_available(), "gpu_bench.py needs a CUDA GPU"
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    copy_gbs = copy_bandwidth()
    print(f"copy bandwidth (4 GiB, read + write, median of 10): {copy_gbs:.0f} GB/s")

    bench_store_kv(copy_gbs)
    for batch in (64, 256):
        for ctx in (2048, 4096):
            for heads, kvh in ((16, 8), (32, 8)):
                for bs in (16, 256):
                    bench_decode(copy_gbs, batch, ctx, heads, kvh, bs)
                    _free()
    _free()
    prefill_shapes = [
        ([4096] * 4, [4096] * 4, 32, 8, 16),
        ([4096] * 4, [4096] * 4, 32, 8, 256),
        ([4096] * 8, [2048] * 8, 32, 8, 16),  # 2k prefix-cache hit + 2k new tokens
        ([1024] * 16, [1024] * 16, 16, 8, 16),
        ([8192] * 2, [512] * 2, 32, 8, 16),  # chunked prefill: a 512-token chunk after a 7.5k prefix
    ]
    for shape in prefill_shapes:
        bench_prefill(copy_gbs, *shape)
        _free()

    if a.sweep:
        for block_n in (32, 64, 128):
            for stages in (2, 3, 4):
                cfg = {"BLOCK_N": block_n, "num_warps": 4, "num_stages": stages}
                bench_decode(copy_gbs, 64, 4096, 32, 8, 16, tile_config=cfg, label=f" N={block_n} st={stages}")
                _free()
        for splits in (1, 2, 4, 8):
            bench_decode(copy_gbs, 64, 4096, 32, 8, 16, num_splits=splits, label=f" splits={splits}")
            _free()

    if a.json:
        Path(a.json).write_text(json.dumps({"copy_gbs": copy_gbs, "results": results}, indent=1))
    if failures:
        print("CORRECTNESS FAILURES:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
