"""Session 8 exploration 1: the decode attention kernel on the headline's own mixed contexts, not uniform ones.

Session 5 measured decode attention at 89% of its bytes bound inside the full-batch headline step, while the
uniform-context microbenchmark reaches 99-106%. This sweep replays the headline's decode steps (nano-vllm's
workload: at decode step s every request with output length > s is running, with context prompt + s + 1),
sampled every 64 steps, each as 28 back-to-back kernel calls over 4 rotating layer caches (shuffled 16-token
blocks, bf16, Qwen3-0.6B attention: 16 / 8 heads, head_dim 128) so every call reads HBM. Per configuration it
reports the estimated attention time of the whole run (sum over samples x 64 steps) against the bytes bound
at the copy bandwidth measured here, and per batch size, which configuration is best.

Variants: tile configuration (BLOCK_N, num_warps, num_stages), splits (the heuristic, or forced), the
longest-first order on/off. Call 1 ran this script's first version (`git show a89f3c8:perf/calls/
s8_decode_mixed_sweep.py`) on b831b16's kernel, with a copy of that kernel whose grid put the KV heads of one
sequence side by side (`heads_fastest`: a token's heads are adjacent 256 B rows of one 2 KB cache row). Since a89f3c8
that grid is the engine's own, so the copy is gone: both rounds now sweep the adopted kernel.

    python3 perf/calls/s8_decode_mixed_sweep.py            # call 1's sweep: tiles, order, splits of the top 3
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
from perf.device import measure_copy_gbps  # noqa: E402
from perf.workloads import decode_contexts, headline  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS, COPIES, EVERY = 16, 8, 128, 16, 28, 4, 64
MAX_MODEL_LEN = 2048 + 16


def step_contexts() -> list[tuple[int, list[int]]]:
    w = headline()
    return [(s, decode_contexts(w, s)) for s in range(0, 1024, EVERY)]


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

    def run(self, cfg: dict, splits: int | None, ordered: bool) -> None:
        order = self.order if ordered else None
        for layer in range(LAYERS):
            k, v = self.caches[layer % COPIES]
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
    ref.run(default, None, True)
    expect = ref.out.clone()

    def measure(label: str, cfg: dict, splits: int | None, ordered: bool) -> tuple[float, list[float]]:
        try:
            ref.run(cfg, splits, ordered)
            err = (ref.out.float() - expect.float()).abs().max().item()
            if err > 2e-2:
                print(f"  {label}: max difference {err:.3g}", flush=True)
                return float("inf"), []
            per = [st.time(cfg, splits, ordered) for _, _, st in samples]
        except Exception as e:  # shared memory / registers
            print(f"  {label}: {type(e).__name__}", flush=True)
            return float("inf"), []
        total = sum(per) * EVERY
        print(f"  {label}: run {total * 1e3:.1f} ms ({bound / total:.1%} of bound); per step us "
              + " ".join(f"{t / LAYERS * 1e6:.0f}" for t in per), flush=True)
        return total, per

    results = {}
    print(f"default {default}", flush=True)
    if "--round2" in sys.argv:  # call 2
        results["default"] = measure("default", default, None, True)
        for splits in (1, 2, 3):
            results[f"default splits={splits}"] = measure(f"default splits={splits}", default, splits, True)
        for bn, warps, stages in [(64, 2, 2), (64, 2, 3), (64, 2, 5), (64, 4, 2), (64, 4, 3), (64, 4, 4),
                                  (64, 4, 5), (32, 2, 5), (32, 4, 5), (128, 4, 2)]:
            cfg = {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
            results[str(cfg)] = measure(str(cfg), cfg, None, True)
            if (bn, warps) == (64, 2):
                results[f"{cfg} splits=1"] = measure(f"{cfg} splits=1", cfg, 1, True)
        round2_report(samples, results)
        return
    results["default"] = measure("default", default, None, True)
    results["default, no order"] = measure("default, no order", default, None, False)
    for bn, warps, stages in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (2, 3, 4, 5)):
        cfg = {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
        if bn * warps > 512 or (bn == 16 and warps > 2):
            continue
        results[str(cfg)] = measure(str(cfg), cfg, None, True)
    top = sorted((v[0], k) for k, v in results.items() if v[1])[:6]
    print("top: " + "; ".join(f"{k} {t * 1e3:.1f} ms" for t, k in top), flush=True)
    for _, key in top[:3]:
        if not key.startswith("{"):
            continue
        cfg = eval(key)  # noqa: S307 (our own dict repr)
        for splits in (1, 2, 4):
            results[key + f" splits={splits}"] = measure(key + f" splits={splits}", cfg, splits, True)
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
