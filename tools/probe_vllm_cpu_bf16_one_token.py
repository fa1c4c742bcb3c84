"""vLLM 0.32 CPU: a bfloat16 model given a one-token prompt kills vLLM's worker process (exit code -4, SIGILL,
on an AMX machine), whatever the KV cache dtype (auto or fp8) and head size (32, 64); float32, or a 5-token
prompt, run. Seen in the fp8-kv tier's bfloat16 runs of qwen2-hd64 and mistral-hd64 (EngineDeadError); not an
FP8 KV matter. Standalone: a random tiny Qwen3.
Run: PROMPTS='[[1]]' VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 python tools/probe_vllm_cpu_bf16_one_token.py \\
         [head_dim=64] [dtype=bfloat16] [kv_cache_dtype=fp8]"""
import json
import os
import sys
import tempfile

PROMPTS = json.loads(os.environ.get("PROMPTS", "[[1]]"))


def main() -> None:
    head_dim = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    dtype = sys.argv[2] if len(sys.argv) > 2 else "bfloat16"
    kv = sys.argv[3] if len(sys.argv) > 3 else "fp8"
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=head_dim, max_position_embeddings=512)
    with tempfile.TemporaryDirectory() as d:
        Qwen3ForCausalLM(cfg).save_pretrained(d)
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(model=d, dtype=dtype, kv_cache_dtype=kv, enforce_eager=True, max_model_len=256)
        out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], SamplingParams(max_tokens=4),
                           use_tqdm=False)
        print(f"OK head_dim={head_dim} dtype={dtype} kv_cache_dtype={kv}: {[o.outputs[0].token_ids for o in out]}")


if __name__ == "__main__":
    main()
