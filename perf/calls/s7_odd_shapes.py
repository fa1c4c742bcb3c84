"""Session 7 probe: the GPU path (Triton kernels, CUDA graphs) on head sizes and GQA ratios the goldens lack.

Tiny random Qwen3 checkpoints (vocab 1001, 2 layers) with head_dim 48/80/96/128/256 and GQA ratios 1/3/4/8; greedy
tokens of 5 prompts (1-100 tokens, 12 new tokens) against transformers (eager attention) in float32 (must be
equal) and bfloat16 (reported: near-ties may flip). Engine: device cuda, Triton backend, CUDA graphs on.

    python3 perf/calls/s7_odd_shapes.py
"""

from __future__ import annotations

import random
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, ".")
from nanovllm_ref import LLM, SamplingParams  # noqa: E402

CASES = {
    "hd80-g3": dict(head_dim=80, num_attention_heads=6, num_key_value_heads=2),
    "hd256-g8": dict(head_dim=256, num_attention_heads=8, num_key_value_heads=1),
    "hd48-g1": dict(head_dim=48, num_attention_heads=4, num_key_value_heads=4),
    "hd96-g4-tied": dict(head_dim=96, num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True),
    "hd128-g2": dict(head_dim=128, num_attention_heads=4, num_key_value_heads=2),
}


def make(path: str, **overrides) -> str:
    base = dict(vocab_size=1001, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                max_position_embeddings=512, initializer_range=0.25, tie_word_embeddings=False, eos_token_id=1,
                bos_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**base, **overrides})).save_pretrained(path)
    return path


def main() -> int:
    failures = 0
    rng = random.Random(1)
    prompts = [[rng.randrange(2, 1001) for _ in range(n)] for n in (1, 7, 17, 40, 100)]
    for name, overrides in CASES.items():
        path = make(f"{tempfile.mkdtemp()}/{name}", **overrides)
        for dtype in (torch.float32, torch.bfloat16):
            hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
            hf = hf.cuda().eval()
            expected = [hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=12, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
            del hf
            llm = LLM(path, device="cuda", dtype=str(dtype).split(".")[1], attention_backend="triton",
                      max_num_seqs=8, max_model_len=256, max_num_batched_tokens=64, gpu_memory_utilization=0.05)
            got = [o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12,
                                                                           ignore_eos=True), use_tqdm=False)]
            llm.shutdown()
            equal = sum(g == e for g, e in zip(got, expected))
            first = sum(g[0] == e[0] for g, e in zip(got, expected))
            ok = equal == len(prompts) or dtype == torch.bfloat16 and first == len(prompts)
            failures += not ok
            print(f"{name} {dtype}: {equal}/{len(prompts)} sequences equal, first tokens {first}/{len(prompts)}"
                  f"{'' if ok else '  <-- FAIL'}", flush=True)
            if not ok:
                print(f"  got {got}\n  expected {expected}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
