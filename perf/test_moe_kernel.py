"""Fused MoE kernel benchmark: Triton grouped-GEMM `fused_moe` vs the pure-torch `fused_moe_ref` (a loop over experts).

Qwen3-30B-A3B's MoE layer (128 experts, top-8, hidden 2048, moe_intermediate 768, bf16) at a decode-like (64 tokens)
and a prefill-like (4096 tokens) batch. GPU variants (`gpu` marker) go through perf/kernel_bench.py's harness
(pytest-benchmark pedantic rounds, CUDA-event time and TFLOP/s in `extra_info`); the `smoke` variant runs the
reference at toy sizes on the CPU. One input set per call: the expert weights alone are 1.2 GB, beyond the L2.

    pytest perf/test_moe_kernel.py -m gpu                   # on the GPU, with the perf suite's baselines
    python -m perf.test_moe_kernel                          # prints Triton vs torch times and the speed-up
    python -m perf.test_moe_kernel --tokens 64 4096 --reps 50
"""

from __future__ import annotations

import argparse
import functools
import statistics

import pytest
import torch

from nanovllm_ref.kernels.fused_moe import fused_moe, fused_moe_ref
from nanovllm_ref.testing.bench.device import has_cuda, time_fn
from perf import kernel_bench as kb

QWEN3_30B_A3B = dict(experts=128, top_k=8, hidden=2048, inter=768)
TOY = dict(experts=8, top_k=2, hidden=64, inter=48)


def moe_case(tokens: int, impl: str, device: str, dtype: torch.dtype, experts: int, top_k: int, hidden: int,
             inter: int, seed: int = 0) -> kb.Case:
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, device=device, generator=g).to(dtype)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, device=device, generator=g) / hidden**0.5).to(dtype)
    w_down = (torch.randn(experts, hidden, inter, device=device, generator=g) / inter**0.5).to(dtype)
    probs = torch.softmax(torch.randn(tokens, experts, device=device, generator=g), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    args = (x, w_gate_up, w_down, weights.to(dtype), ids)
    fn = fused_moe if impl == "triton" else fused_moe_ref
    flops = 6 * tokens * top_k * hidden * inter  # gate_up (2I x H) + down (H x I), 2 flops per MAC
    return kb.Case(f"moe-{impl}-t{tokens}-e{experts}-k{top_k}", fn, [args], flops_per_call=flops,
                   set_bytes=kb._nbytes(args))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["triton", "torch"])
@pytest.mark.parametrize("tokens", [64, 4096])
def test_fused_moe(benchmark, ceilings, tokens, impl):
    benchmark.group = f"fused_moe-t{tokens}"
    case = moe_case(tokens, impl, "cuda", torch.bfloat16, **QWEN3_30B_A3B)
    kb.run_case(benchmark, case, "cuda", ceilings, 20, 3, 10)


@pytest.mark.smoke
def test_fused_moe_smoke(benchmark, ceilings):
    benchmark.group = "smoke-fused_moe"
    info = kb.run_case(benchmark, moe_case(16, "torch", "cpu", torch.float32, **TOY), "cpu", ceilings, 3, 1, 3)
    assert info["tflops"] > 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 4096])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--toy", action="store_true", help="toy sizes (default on a machine without CUDA)")
    args = parser.parse_args(argv)
    device = "cuda" if has_cuda() else "cpu"
    shape, dtype = (TOY, torch.float32) if args.toy or device == "cpu" else (QWEN3_30B_A3B, torch.bfloat16)
    print(f"fused MoE on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}: {shape}, {dtype}")
    for tokens in args.tokens:
        us = {}
        for impl in ("triton", "torch"):
            case = moe_case(tokens, impl, device, dtype, **shape)
            call = functools.partial(case.fn, *case.sets[0])
            us[impl] = statistics.median(time_fn(call, args.reps, device)) * 1e6
        tflops = case.flops_per_call / us["triton"] / 1e6
        print(f"tokens {tokens:5d}: triton {us['triton']:10.1f} us ({tflops:6.1f} TFLOP/s)   "
              f"torch {us['torch']:10.1f} us   speed-up x{us['torch'] / us['triton']:.2f}")


if __name__ == "__main__":
    main()
