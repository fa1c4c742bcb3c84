"""Session 8 exploration 1: the decode attention kernel on the headline's own mixed contexts, not uniform ones.

Session 5 measured decode attention at 89% of its bytes bound inside the full-batch headline step, while the
uniform-context microbenchmark reaches 99-106%. This sweep replays the headline's decode steps (nano-vllm's
workload: at decode step s every request with output length > s is running, with context prompt + s + 1),
sampled every 64 steps, each as 28 back-to-back kernel calls over 4 rotating layer caches (shuffled 16-token
blocks, bf16, Qwen3-0.6B attention: 16 / 8 heads, head_dim 128) so every call reads HBM. Per configuration it
reports the estimated attention time of the whole run (sum over samples x 64 steps) against the bytes bound
at the copy bandwidth measured here, and per batch size, which configuration is best.

Variants: tile configuration (BLOCK_N, num_warps, num_stages), splits (the heuristic, or forced), the
longest-first order on/off, and a grid in which the KV heads of one sequence are adjacent programs
(`heads_fastest`: the heads of a token are adjacent in the cache, 8 x 256 B rows of one 2 KB line run).

    python3 perf/calls/s8_decode_mixed_sweep.py            # call 1: tiles, order, the heads-adjacent grid
    python3 perf/calls/s8_decode_mixed_sweep.py --round2   # call 2: tiles and splits of the adopted grid
"""

from __future__ import annotations

import itertools
import statistics
import sys

import torch

sys.path.insert(0, ".")
from nanovllm_ref.attention.metadata import decode_batch_bucket  # noqa: E402
from nanovllm_ref.kernels import decode_attention as da  # noqa: E402
from nanovllm_ref.kernels._triton_common import LOG2E, attend_tile, tl, triton  # noqa: E402
from perf.device import measure_copy_gbps  # noqa: E402
from perf.workloads import headline  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS, COPIES, EVERY = 16, 8, 128, 16, 28, 4, 64
MAX_MODEL_LEN = 2048 + 16


@triton.jit
def _heads_fastest_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, order_ptr, out_ptr, qk_scale,
    stride_qs, stride_qh, stride_qd, stride_os, stride_oh, stride_od,
    stride_cb, stride_cs, stride_ch, stride_cd, stride_bt, group,
    NUM_KVH: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr, HAS_ORDER: tl.constexpr,
):
    pid = tl.program_id(0)
    seq = pid // NUM_KVH
    if HAS_ORDER:
        seq = tl.load(order_ptr + seq).to(tl.int32)
    kvh = pid % NUM_KVH
    end = tl.load(seq_lens_ptr + seq)
    full_end = end // BLOCK_N * BLOCK_N
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * group + offs_g
    g_mask = offs_g < group
    q_off = seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptr + q_off, mask=g_mask[:, None], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    k_base = k_cache_ptr + kvh * stride_ch
    v_base = v_cache_ptr + kvh * stride_ch
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    row_end = tl.full([BLOCK_G], 0, tl.int32) + end
    for n0 in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = attend_tile(acc, l_i, m_i, q, k_base, v_base, bt_row, n0, end, row_end, qk_scale,
                                    stride_cb, stride_cs, stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM,
                                    False, False, "tf32")
    if full_end < end:
        acc, l_i, m_i = attend_tile(acc, l_i, m_i, q, k_base, v_base, bt_row, full_end, end, row_end, qk_scale,
                                    stride_cb, stride_cs, stride_cd, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM,
                                    True, False, "tf32")
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


def heads_fastest(q, k, v, tables, seq_lens, scale, order, out, cfg):
    cfg = dict(cfg)
    bn = cfg.pop("BLOCK_N")
    _heads_fastest_kernel[(q.shape[0] * KV_HEADS,)](
        q, k, v, tables, seq_lens, seq_lens if order is None else order, out, scale * LOG2E,
        *q.stride(), *out.stride(), *k.stride(), tables.stride(0), HEADS // KV_HEADS,
        NUM_KVH=KV_HEADS, BLOCK_SIZE=BLOCK, BLOCK_N=bn, BLOCK_G=16, BLOCK_D=HEAD_DIM, HEAD_DIM=HEAD_DIM,
        HAS_ORDER=order is not None, **cfg)
    return out


def step_contexts() -> list[tuple[int, list[int]]]:
    w = headline()
    plens = [len(p) for p in w.prompts]
    return [(s, [p + s + 1 for p, o in zip(plens, w.output_lens) if o > s]) for s in range(0, 1024, EVERY)]


class Step:
    def __init__(self, ctx: list[int], dev: str):
        g = torch.Generator(device=dev).manual_seed(len(ctx))
        blocks = [-(-n // BLOCK) for n in ctx]
        nb = sum(blocks)
        shape = (nb, BLOCK, KV_HEADS, HEAD_DIM)
        self.caches = [(torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g),
                        torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g)) for _ in range(COPIES)]
        perm = torch.randperm(nb, device=dev, generator=g).to(torch.int32)
        width = -(-MAX_MODEL_LEN // BLOCK)
        self.tables = torch.zeros(len(ctx), width, dtype=torch.int32, device=dev)
        start = 0
        for i, b in enumerate(blocks):
            self.tables[i, :b] = perm[start:start + b]
            start += b
        self.seq_lens = torch.tensor(ctx, dtype=torch.int32, device=dev)
        self.order = torch.argsort(self.seq_lens, descending=True, stable=True).to(torch.int32)
        self.q = torch.randn(len(ctx), HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16, generator=g)
        self.out = torch.empty_like(self.q)
        self.bytes = LAYERS * (sum(ctx) * KV_HEADS * HEAD_DIM * 2 * 2 + 2 * self.q.numel() * 2)
        self.ws = torch.empty(da.decode_workspace_numel(len(ctx), HEADS, HEAD_DIM, 64), device=dev)

    def run(self, variant: str, cfg: dict, splits: int | None, ordered: bool) -> None:
        order = self.order if ordered else None
        for layer in range(LAYERS):
            k, v = self.caches[layer % COPIES]
            if variant == "heads_fastest":
                heads_fastest(self.q, k, v, self.tables, self.seq_lens, HEAD_DIM**-0.5, order, self.out, cfg)
            else:
                da.decode_attention(self.q, k, v, self.tables, self.seq_lens, HEAD_DIM**-0.5,
                                    max_seq_len=MAX_MODEL_LEN, split_batch=decode_batch_bucket(len(self.seq_lens)),
                                    num_splits=splits, order=order, out=self.out, workspace=self.ws, tile_config=cfg)

    def time(self, *args, reps: int = 5) -> float:
        self.run(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            self.run(*args)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times)


def main() -> None:
    dev = "cuda"
    gbps = measure_copy_gbps(dev)
    samples = [(s, ctx, Step(ctx, dev)) for s, ctx in step_contexts()]
    bound = sum(st.bytes for _, _, st in samples) / (gbps * 1e9) * EVERY
    print(f"copy {gbps:.0f} GB/s; {len(samples)} sampled steps; run bound {bound * 1e3:.1f} ms", flush=True)
    print("steps: " + ", ".join(f"{s}:{len(c)}x{sum(c) // len(c)}" for s, c, _ in samples), flush=True)
    default = da.decode_tile_config(HEAD_DIM, torch.bfloat16)
    ref = samples[0][2]
    ref.run("split", default, None, True)
    expect = ref.out.clone()

    def measure(label: str, variant: str, cfg: dict, splits: int | None, ordered: bool) -> tuple[float, list[float]]:
        try:
            ref.run(variant, cfg, splits, ordered)
            err = (ref.out.float() - expect.float()).abs().max().item()
            if err > 2e-2:
                print(f"  {label}: max difference {err:.3g}", flush=True)
                return float("inf"), []
            per = [st.time(variant, cfg, splits, ordered) for _, _, st in samples]
        except Exception as e:  # shared memory / registers
            print(f"  {label}: {type(e).__name__}", flush=True)
            return float("inf"), []
        total = sum(per) * EVERY
        print(f"  {label}: run {total * 1e3:.1f} ms ({bound / total:.1%} of bound); per step us "
              + " ".join(f"{t / LAYERS * 1e6:.0f}" for t in per), flush=True)
        return total, per

    results = {}
    print(f"default {default}", flush=True)
    if "--round2" in sys.argv:  # call 2: the production kernel has the heads-adjacent grid since this call
        results["default"] = measure("default", "split", default, None, True)
        for splits in (1, 2, 3):
            results[f"default splits={splits}"] = measure(f"default splits={splits}", "split", default, splits, True)
        for bn, warps, stages in [(64, 2, 2), (64, 2, 3), (64, 2, 5), (64, 4, 2), (64, 4, 3), (64, 4, 4),
                                  (64, 4, 5), (32, 2, 5), (32, 4, 5), (128, 4, 2)]:
            cfg = {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
            results[str(cfg)] = measure(str(cfg), "split", cfg, None, True)
            if (bn, warps) == (64, 2):
                results[f"{cfg} splits=1"] = measure(f"{cfg} splits=1", "split", cfg, 1, True)
        round2_report(samples, results)
        return
    results["default"] = measure("default", "split", default, None, True)
    results["default, no order"] = measure("default, no order", "split", default, None, False)
    results["default, heads_fastest"] = measure("default heads_fastest", "heads_fastest", default, None, True)
    for bn, warps, stages in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (2, 3, 4, 5)):
        cfg = {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
        if bn * warps > 512 or (bn == 16 and warps > 2):
            continue
        results[str(cfg)] = measure(str(cfg), "split", cfg, None, True)
    top = sorted((v[0], k) for k, v in results.items() if v[1])[:6]
    print("top: " + "; ".join(f"{k} {t * 1e3:.1f} ms" for t, k in top), flush=True)
    for _, key in top[:3]:
        if not key.startswith("{"):
            continue
        cfg = eval(key)  # noqa: S307 (our own dict repr)
        results[key + " heads_fastest"] = measure(key + " heads_fastest", "heads_fastest", cfg, None, True)
        for splits in (1, 2, 4):
            results[key + f" splits={splits}"] = measure(key + f" splits={splits}", "split", cfg, splits, True)
    round2_report(samples, results)


def round2_report(samples: list, results: dict) -> None:
    print("best per sampled step (us per layer):", flush=True)
    valid = {k: v for k, v in results.items() if v[1]}
    for i, (s, ctx, _) in enumerate(samples):
        best = min(valid, key=lambda k: valid[k][1][i])
        print(f"  step {s} ({len(ctx)} seqs): default {valid['default'][1][i] / LAYERS * 1e6:.1f}, "
              f"best {valid[best][1][i] / LAYERS * 1e6:.1f} {best}", flush=True)


if __name__ == "__main__":
    main()
