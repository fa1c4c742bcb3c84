"""Where the batch-invariant mode's attention time goes on the headline, and which kernels give the mode's bits.

    python -m perf.invariant_attention [--every 32] [--json OUT.json]

Qwen3-0.6B's attention (16 query heads, 8 KV heads, d 128, bf16, 16-token pages scattered over the cache), each
variant timed as CUDA-graph replays (10 calls, median of 5), scaled to 28 layers and to every step:
- decode: the headline's decode steps (workloads.decode_contexts, every `--every`-th), through `prefill` (the
  prefill kernel with the mode's one tile, kernels/invariant_attention.invariant_prefill_tile), `decode` (the decode
  kernel unsplit with the same tile, longest context first: the mode's decode-only steps), `decode-unordered` (the
  same in batch order) and `default` (the default mode's decode kernel: split count by batch, longest first);
- prefill: the headline's prompts packed into steps of 16,384 tokens (the last prompt of a step chunked), the mode's
  tile against the default tile and larger candidates.
Bits: each variant's output against the mode's (torch.equal); the `decode` kernel also against the prefill kernel
run over whole prompts (a token's decode-time and prefill-time attention must be one computation).
"""

from __future__ import annotations

import argparse
import json

import torch

from nanovllm_ref.attention.metadata import decode_batch_bucket
from nanovllm_ref.kernels.decode_attention import decode_attention
from nanovllm_ref.kernels.invariant_attention import invariant_decode_tile, invariant_prefill_tile
from nanovllm_ref.kernels.prefill_attention import prefill_attention
from nanovllm_ref.testing.bench import workloads

from .invariant_tile import _time

HEADS, KV_HEADS, D, PAGE, LAYERS, BUDGET = 16, 8, 128, 16, 28, 16384
PREFILL_TILES = {"64q-64k-4w-2s": {"BLOCK_Q": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
                 "64q-64k-2w-3s": {"BLOCK_Q": 64, "BLOCK_N": 64, "num_warps": 2, "num_stages": 3},
                 "32q-64k-2w-4s": {"BLOCK_Q": 32, "BLOCK_N": 64, "num_warps": 2, "num_stages": 4}}


class Cache:
    """Pages for every request's whole prompt + output, scattered (a random permutation)."""

    def __init__(self, w: workloads.Workload) -> None:
        lens = [len(p) + n for p, n in zip(w.prompts, w.output_lens)]
        pages = [-(-n // PAGE) for n in lens]
        perm = torch.randperm(sum(pages), device="cuda").to(torch.int32)
        self.tables = torch.zeros(len(lens), max(pages), dtype=torch.int32, device="cuda")
        at = 0
        for i, n in enumerate(pages):
            self.tables[i, :n] = perm[at : at + n]
            at += n
        self.k, self.v = (torch.randn(sum(pages), PAGE, KV_HEADS, D, device="cuda", dtype=torch.bfloat16)
                          for _ in range(2))


def decode_variants(cache: Cache, seqs: list[int], lens: list[int]) -> dict:
    n, scale = len(seqs), D**-0.5
    q = torch.randn(n, HEADS, D, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    tables = cache.tables[torch.tensor(seqs, device="cuda")]
    order = torch.argsort(-seq_lens.long(), stable=True)
    qsl = torch.arange(n + 1, dtype=torch.int32, device="cuda")
    tile = invariant_decode_tile()
    return {
        "prefill": lambda: prefill_attention(q, cache.k, cache.v, qsl, seq_lens, tables, scale, 1,
                                             tile_config=invariant_prefill_tile(HEADS, KV_HEADS)),
        "decode": lambda: decode_attention(q, cache.k, cache.v, tables, seq_lens, scale, num_splits=1,
                                           tile_config=tile, order=order),
        "decode-unordered": lambda: decode_attention(q, cache.k, cache.v, tables, seq_lens, scale, num_splits=1,
                                                     tile_config=tile),
        "default": lambda: decode_attention(q, cache.k, cache.v, tables, seq_lens, scale, max_seq_len=4096,
                                            split_batch=decode_batch_bucket(n), order=order),
    }


def prefill_steps(w: workloads.Workload) -> list[list[tuple[int, int, int]]]:
    """Steps of (request, first prompt token, tokens), BUDGET tokens each, prompts in order, chunked at the edge."""
    steps, step, room = [], [], BUDGET
    for i, p in enumerate(w.prompts):
        at = 0
        while at < len(p):
            take = min(room, len(p) - at)
            step.append((i, at, take))
            at, room = at + take, room - take
            if room == 0:
                steps.append(step)
                step, room = [], BUDGET
    return steps + ([step] if step else [])


def prefill_variants(cache: Cache, step: list[tuple[int, int, int]]) -> tuple[dict, torch.Tensor]:
    scale = D**-0.5
    qsl = torch.tensor([0] + [t for _, _, t in step], device="cuda").cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([a + t for _, a, t in step], dtype=torch.int32, device="cuda")
    tables = cache.tables[torch.tensor([i for i, _, _ in step], device="cuda")]
    q = torch.randn(int(qsl[-1]), HEADS, D, device="cuda", dtype=torch.bfloat16)
    longest = max(t for _, _, t in step)
    tiles = {"mode": invariant_prefill_tile(HEADS, KV_HEADS), "default": None, **PREFILL_TILES}
    fns = {name: (lambda c=c: prefill_attention(q, cache.k, cache.v, qsl, seq_lens, tables, scale, longest,
                                                tile_config=c)) for name, c in tiles.items()}
    return fns, (q, qsl, seq_lens, tables)


def whole_prompt_bits(cache: Cache, step_inputs: tuple, requests: int = 3) -> bool:
    """The decode kernel on each token of the first `requests` prompts of a step against the mode's prefill kernel
    over those prompts: bitwise equal?"""
    q, qsl, seq_lens, tables = step_inputs
    full = prefill_attention(q, cache.k, cache.v, qsl, seq_lens, tables, D**-0.5, int(qsl.diff().max()),
                             tile_config=invariant_prefill_tile(HEADS, KV_HEADS))
    rows = torch.arange(int(qsl[requests]), device="cuda")
    seq = torch.searchsorted(qsl[1:].long(), rows, right=True)
    pos = seq_lens[seq] - (qsl[seq + 1] - rows)  # prefix + index in the chunk
    dec = decode_attention(q[rows], cache.k, cache.v, tables[seq], (pos + 1).to(torch.int32), D**-0.5,
                           num_splits=1, tile_config=invariant_decode_tile())
    return torch.equal(dec, full[rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=int, default=32)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    w = workloads.headline()
    cache = Cache(w)
    ms: dict[str, float] = {}
    bits: dict[str, int] = {}
    for t in range(0, max(w.output_lens), args.every):
        seqs = [i for i, n in enumerate(w.output_lens) if n > t]
        fns = decode_variants(cache, seqs, [len(w.prompts[i]) + t + 1 for i in seqs])
        ref = fns["prefill"]()
        for name, fn in fns.items():
            ms[f"decode {name}"] = ms.get(f"decode {name}", 0.0) + _time(fn) * args.every * LAYERS
            bits[f"decode {name}"] = bits.get(f"decode {name}", 0) + int(torch.equal(fn(), ref))
    for i, step in enumerate(prefill_steps(w)):
        fns, inputs = prefill_variants(cache, step)
        ref = fns["mode"]()
        for name, fn in fns.items():
            ms[f"prefill {name}"] = ms.get(f"prefill {name}", 0.0) + _time(fn, calls=3, reps=3) * LAYERS
            bits[f"prefill {name}"] = bits.get(f"prefill {name}", 0) + int(torch.equal(fn(), ref))
        if i == 0:
            bits["decode kernel = prefill kernel over whole prompts"] = int(whole_prompt_bits(cache, inputs))
    print("| variant | ms over the headline (28 layers) | steps bitwise equal to the mode's |")
    for name in ms:
        print(f"| {name} | {ms[name]:.1f} | {bits[name]} |")
    print(f"decode kernel vs prefill kernel over whole prompts, bitwise: "
          f"{bool(bits['decode kernel = prefill kernel over whole prompts'])}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ms": ms, "bits_equal_steps": bits, "every": args.every}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
