"""GPU sweep of FP8-cache decode kernels on the headline's decode shapes (one call of a GPU machine).

For each headline decode step given (the contexts of the sequences still running when every request is admitted
at once; longest first; the engine's split choice): the engine's kernel on a bf16 cache and on an fp8 cache, then
each variant `CVT:BLOCK_N/warps/stages[p]` of perf/fp8_decode_variants.py (CVT: how a tile becomes float16; p: two
tiles per loop iteration), checked against the engine's fp8 output and timed by CUDA events (median of
triton.testing.do_bench). Ends with the compiled variants' registers, spills and byte-wide shared loads, and one
table: us per call, GB/s of the KV bytes.

    python -m perf.fp8_decode_sweep --steps 0 320 640 --variants 0:64/2/4 1:32/1/4 2:32/1/4
    python -m perf.fp8_decode_sweep --variants --engine-tiles 32/1/4/s 64/2/6/s bf16:64/2/4/s --json rows.json
    python -m perf.fp8_decode_sweep --variants t:16/1/4 t:16/1/6 --engine-tiles 32/1/6/s
"""

from __future__ import annotations

import argparse
import json

import torch

from nanovllm_ref.attention.metadata import decode_batch_bucket
from nanovllm_ref.kernels.decode_attention import decode_attention
from nanovllm_ref.kernels.kv_quant import quantize_kv
from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.device import measure_copy_gbps

VARIANTS = ["0:64/2/4", "0:64/2/4p", "0:64/2/2p", "0:32/2/4p", "0:32/1/4", "0:32/1/4p", "0:16/1/4", "0:64/4/3p",
            "1:64/2/4", "1:64/2/4p", "1:32/1/4", "1:32/1/4p", "2:32/1/4", "2:32/1/4p", "2:64/2/4p"]


def headline_step(step: int, dtype=torch.bfloat16, block_size: int = 16, max_model_len: int = 4096, seed: int = 0):
    """q, bf16 caches, fp8 caches, scales, block tables, seq_lens, order of headline decode step `step`."""
    contexts = workloads.decode_contexts(workloads.headline(), step)
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks = [-(-n // block_size) for n in contexts]
    shape = (sum(blocks), block_size, 8, 128)
    k, v = (torch.randn(shape, device="cuda", generator=g, dtype=dtype) for _ in range(2))
    scales = torch.rand(2, 8, device="cuda", generator=g) / 64 + 1 / 128
    k8, v8 = (quantize_kv(c.view(-1, 8, 128), scales[i]).view(shape) for i, c in enumerate((k, v)))
    perm = torch.randperm(sum(blocks), device="cuda", generator=g).to(torch.int32)
    tables = torch.zeros(len(contexts), -(-max_model_len // block_size), dtype=torch.int32, device="cuda")
    start = 0
    for row, n in enumerate(blocks):
        tables[row, :n] = perm[start:start + n]
        start += n
    seq_lens = torch.tensor(contexts, dtype=torch.int32, device="cuda")
    q = torch.randn(len(contexts), 16, 128, device="cuda", generator=g, dtype=dtype)
    order = torch.argsort(seq_lens, descending=True, stable=True).to(torch.int32)
    return q, (k, v), (k8, v8), scales, tables, seq_lens, order


def parse_tile(tile: str) -> tuple[bool, dict]:
    """`[bf16:]BLOCK_N/warps/stages[/rN][/s]` or `g:BLOCK_N/STAGES` (the Gluon kernel, kernels/decode_attention_fp8.py)
    -> (fp8 cache, decode_attention's tile_config)."""
    if tile.startswith("g:"):
        bn, st = tile[2:].split("/")
        return True, {"GLUON": 1, "BLOCK_N": int(bn), "STAGES": int(st)}
    bn, w, st, *extra = tile.removeprefix("bf16:").split("/")
    cfg = {"BLOCK_N": int(bn), "num_warps": int(w), "num_stages": int(st)}
    for field in extra:  # rN: at most N registers per thread (maxnreg); s: transposed products (SWAP)
        if field == "s":
            cfg["SWAP"] = True
        else:
            cfg["maxnreg"] = int(field.lstrip("r"))
    return not tile.startswith("bf16:"), cfg


def compiled_report() -> None:
    """Registers, spills and byte-wide shared-memory loads (the slow V read) of every compiled fp8 variant."""
    from .fp8_decode_variants import decode_fp8_split_kernel, decode_fp8_vt_split_kernel

    for cache in [*getattr(decode_fp8_split_kernel, "device_caches", {}).values(),
                  *getattr(decode_fp8_vt_split_kernel, "device_caches", {}).values()]:
        for k in cache[0].values():
            ptx = k.asm.get("ptx", "")
            c = {n: getattr(k.metadata, n, None) for n in ("num_warps", "num_stages", "shared")}
            print(f"compiled {c} regs {k.n_regs} spills {k.n_spills}"
                  f" ld.shared.u8/b8 {ptx.count('ld.shared.u8') + ptx.count('ld.shared.b8')}"
                  f" cvt.e4m3x2 {ptx.count('e4m3x2')} ldmatrix {ptx.count('ldmatrix')}")


def sweep_step(step: int, variants: list[str], engine_tiles: list[str], rows: list[tuple]) -> None:
    import triton.testing

    from .fp8_decode_variants import decode_fp8_variant, decode_fp8_vt_variant, transpose_v_blocks

    q, bf, f8, scales, tables, seq_lens, order = headline_step(step)
    n, kv_tokens = q.shape[0], int(seq_lens.sum())
    kw = dict(max_seq_len=4096, split_batch=decode_batch_bucket(n))

    def engine(cache, fp8=True):
        return lambda: decode_attention(q, *cache, tables, seq_lens, 128**-0.5, kv_scales=scales if fp8 else None,
                                        order=order, **kw)

    def timed(name, fn, elem, want=None):
        out = fn()
        err = float((out.float() - want.float()).abs().max()) if want is not None else 0.0
        us = triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3
        gbps = 2 * kv_tokens * 8 * 128 * elem / us / 1e3
        rows.append((step, n, name, us, gbps, err))
        print(f"step {step:4d} b{n:3d} {name:24s} {us:8.1f} us {gbps:7.0f} GB/s maxerr {err:.2e}", flush=True)

    want = engine(f8)()
    want_bf = engine(bf, fp8=False)()
    timed("engine bf16", engine(bf, fp8=False), 2)
    timed("engine fp8", engine(f8), 1, want)
    for tile in engine_tiles:  # the engine's own kernel at other tiles (fp8 cache; a "bf16:" prefix: bf16 cache)
        fp8, cfg = parse_tile(tile)
        name = f"engine {'fp8' if fp8 else 'bf16'} {tile.removeprefix('bf16:')}"
        try:
            timed(name, lambda cfg=cfg, fp8=fp8: decode_attention(
                q, *(f8 if fp8 else bf), tables, seq_lens, 128**-0.5, kv_scales=scales if fp8 else None, order=order,
                tile_config=cfg, **kw), 1 if fp8 else 2, want if fp8 else want_bf)
        except Exception as e:  # a tile that does not compile (shared memory): say so, keep sweeping
            print(f"step {step} {name}: {type(e).__name__}: {str(e)[:120]}")
    vt = transpose_v_blocks(f8[1]) if any(v.startswith("t:") for v in variants) else None
    for spec in variants:
        cvt, tile = spec.split(":")
        if cvt == "t":  # V transposed within each cache block (decode_fp8_vt_variant)
            bn, w, st = (int(x) for x in tile.split("/"))
            cfg = {"BLOCK_N": bn, "num_warps": w, "num_stages": st}
            try:
                timed(f"t:{tile}", lambda cfg=cfg: decode_fp8_vt_variant(q, f8[0], vt, tables, seq_lens, 128**-0.5,
                                                                       scales, order=order, tile=cfg, **kw), 1, want)
            except Exception as e:
                print(f"step {step} t:{tile}: {type(e).__name__}: {str(e)[:120]}")
            continue
        bn, w, st = (int(x) for x in tile.rstrip("p").split("/"))
        cfg = {"BLOCK_N": bn, "num_warps": w, "num_stages": st, "CVT": int(cvt), "PAIRS": tile.endswith("p")}
        try:
            timed(f"cvt{spec}", lambda cfg=cfg: decode_fp8_variant(q, *f8, tables, seq_lens, 128**-0.5, scales,
                                                                   order=order, tile=cfg, **kw), 1, want)
        except Exception as e:  # a variant that does not compile (shared memory): say so, keep sweeping
            print(f"step {step} cvt{spec}: {type(e).__name__}: {str(e)[:120]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[0, 320, 640])
    ap.add_argument("--variants", nargs="*", default=VARIANTS,
                    help="CVT:BLOCK_N/warps/stages, a trailing p: two tiles per iteration; t:BLOCK_N/warps/stages: V "
                         "transposed in the cache blocks (decode_fp8_vt_variant)")
    ap.add_argument("--engine-tiles", nargs="*", default=[],
                    help="[bf16:]BLOCK_N/warps/stages[/rN][/s]: the engine's kernel at these tiles too, fp8 cache"
                         " unless bf16: (rN: maxnreg N; s: transposed products); g:BLOCK_N/STAGES: the Gluon kernel")
    ap.add_argument("--json", help="also write the rows (step, batch, name, us, GB/s, maxerr) to this file")
    args = ap.parse_args()
    print(f"copy ceiling {measure_copy_gbps('cuda'):.0f} GB/s")
    rows: list[tuple] = []
    for step in args.steps:
        sweep_step(step, args.variants, args.engine_tiles, rows)
    compiled_report()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    print("\nstep batch variant us GB/s maxerr")
    for r in sorted(rows, key=lambda r: (r[0], r[3])):
        print(f"{r[0]} {r[1]} {r[2]!r} {r[3]:.1f} {r[4]:.0f} {r[5]:.1e}")


if __name__ == "__main__":
    main()
