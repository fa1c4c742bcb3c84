"""Minimal reproductions of the engine and converter bugs the local peers show (conformance/README.md, "Peers"),
each on a golden checkpoint or a one-field copy of one, with transformers float32 as the reference:

- ``ct2-llama3-rope``: CTranslate2's LlamaLoader passes no ``original_max_position_embeddings``; its runtime then
  runs ``rope_type: llama3`` as no scaling at all (it matches transformers *without* the scaling).
- ``ct2-llama-head-dim``: CTranslate2's LlamaLoader ignores ``head_dim`` (the first generate fails on the shapes).
- ``ct2-mistral-unk``: CTranslate2's MistralLoader writes ``unk_token: null``, which its runtime refuses.
- ``ort-head-size``: ONNX Runtime GenAI's builder exports head_dim 24, which its CPU attention refuses.
- ``llamacpp-wordlevel``: llama.cpp's converter writes a WordLevel tokenizer as a BPE vocabulary without merges
  (a warning only), and its loader then refuses the file.
- ``llamacpp-byte-tokens``: llama-cpp-python's completions (and so its server) name every byte-fallback token ``''``
  in their logprobs (its bytes decoded with ``errors="ignore"``), so a text-keyed client cannot tell them apart.
- ``llamacpp-echo``: llama-cpp-python's ``create_completion(echo=True, logprobs=k)`` (and so its server) gives each
  token the logprob of its own position's row, the next token's distribution, and drops the last token.

    python -m tools.probe_peer_bugs ct2-llama3-rope    (in a venv with the engine; NANOVLLM_REF_CACHE for conversions)
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

PROMPT = [[5, 17, 300, 41, 99, 7, 12, 800, 3, 60, 61, 62]]


def _first_step_diff(a, b) -> float:
    """max |dlogprob| over the top-20 shared by two outputs' first generated step."""
    return max(abs(a.topk[0][t] - b.topk[0][t]) for t in a.topk[0].keys() & b.topk[0].keys())


def _copy_with(checkpoint: str, edit) -> str:
    from golden.load import checkpoint_path

    dst = Path(tempfile.mkdtemp()) / checkpoint
    shutil.copytree(checkpoint_path(checkpoint), dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def ct2_llama3_rope() -> None:
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.adapters import HFAdapter
    from nanovllm_ref.oracle.ctranslate2_adapter import CTranslate2Adapter

    src = checkpoint_path("llama3-tiny")  # rope_type llama3, factor 8, original_max_position_embeddings 256
    plain = _copy_with("llama3-tiny", lambda c: c.update(rope_parameters={
        "rope_type": "default", "rope_theta": c["rope_parameters"]["rope_theta"]}))
    ct = CTranslate2Adapter(src).generate(PROMPT, 1, 20, False)[0]
    for name, path in (("transformers with the llama3 scaling", src), ("transformers without any scaling", plain)):
        hf = HFAdapter(path).generate(PROMPT, 1, 20, False)[0]
        print(f"CTranslate2 on llama3-tiny vs {name}: max |dlogprob| {_first_step_diff(hf, ct):.3g}")


def ct2_llama_head_dim() -> None:
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.ctranslate2_adapter import CTranslate2Adapter

    try:  # llama3-bias-hd32: head_dim 32, hidden_size 128 / 8 heads = 16
        CTranslate2Adapter(checkpoint_path("llama3-bias-hd32")).generate(PROMPT, 1, 20, False)
    except ValueError as e:
        print(f"CTranslate2 on llama3-bias-hd32 (head_dim 32 != 128 / 8): {e}")
    else:
        print("CTranslate2 ran llama3-bias-hd32: fixed")


def ct2_mistral_unk() -> None:
    import ctranslate2

    from golden.load import checkpoint_path
    from nanovllm_ref.oracle import ctranslate2_adapter as ct2

    model = Path(tempfile.mkdtemp()) / "model"
    cmd = [sys.executable, "-c", ct2._CONVERTER, "--model", checkpoint_path("mistral-tiny"), "--output_dir", model]
    ct2.run_converter(cmd, model.parent)
    print("config.json unk_token:", json.loads((model / "config.json").read_text()).get("unk_token", "(absent)"))
    try:
        ctranslate2.Generator(str(model), device="cpu")
    except RuntimeError as e:
        print(f"ctranslate2.Generator refuses it: {e}")
    else:
        print("ctranslate2.Generator loads it: fixed")


def ort_head_size() -> None:
    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.ortgenai_adapter import OrtGenAIAdapter

    try:  # mistral-tiny: head_dim 24
        OrtGenAIAdapter(checkpoint_path("mistral-tiny")).generate(PROMPT, 1, 20, False)
    except RuntimeError as e:
        print(f"ONNX Runtime GenAI on mistral-tiny (head_dim 24), exported without complaint: {e}")
    else:
        print("ONNX Runtime GenAI ran head_dim 24: fixed")


def llamacpp_echo() -> None:
    import llama_cpp

    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.llamacpp_adapter import convert

    llm = llama_cpp.Llama(str(convert(checkpoint_path("qwen3-tiny"))), n_ctx=256, logits_all=True, n_threads=1,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)
    prompt = "The quick brown fox"
    n = len(llm.tokenize(prompt.encode(), add_bos=False))
    for echo in (False, True):
        lp = llm.create_completion(prompt, max_tokens=4, temperature=0, logprobs=1, echo=echo)["choices"][0]["logprobs"]
        tokens, values = lp["tokens"][n if echo else 0:], lp["token_logprobs"][n if echo else 0:]
        print(f"echo={echo}: generated {tokens}, logprobs {[round(float(v), 4) for v in values]}")


def llamacpp_wordlevel() -> None:
    import subprocess

    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.llamacpp_adapter import convert

    gguf = convert(checkpoint_path("qwen3-words-hd32"))  # tokenizer.json: WordLevel + Whitespace, no merges
    warned = [line for line in (gguf.parent / "convert.log").read_text().splitlines() if "merges" in line]
    print(f"convert_hf_to_gguf.py exported qwen3-words-hd32, saying only: {warned}")
    load = "import sys, llama_cpp; llama_cpp.Llama(sys.argv[1], n_ctx=64, verbose=True)"  # its log goes to stderr
    run = subprocess.run([sys.executable, "-c", load, str(gguf)], capture_output=True, text=True)
    said = [line for line in run.stderr.splitlines() if "error loading model" in line]
    print(f"llama_cpp.Llama {'refuses it: ' + str(said) if run.returncode else 'loads it: fixed'}")


def llamacpp_byte_tokens() -> None:
    import llama_cpp

    from golden.load import checkpoint_path
    from nanovllm_ref.oracle.llamacpp_adapter import convert
    from nanovllm_ref.oracle.references import golden_reference

    llm = llama_cpp.Llama(str(convert(checkpoint_path("mistral-spm-hd32"))), n_ctx=256, logits_all=True, verbose=False)
    nameless = [i for i in range(llm.n_vocab()) if llm.detokenize([i]).decode("utf-8", errors="ignore") == ""]
    print(f"mistral-spm-hd32 (byte-fallback BPE): {len(nameless)} of {llm.n_vocab()} ids have the text '' there, e.g. "
          f"{[(i, llm.detokenize([i])) for i in nameless[3:6]]}")
    ref = golden_reference("mistral-spm-hd32", "float32")
    for pid, prompt, out in zip(ref.prompt_ids, ref.prompts, ref.outputs):
        if any(t in nameless for t in out.token_ids[:8]):
            step = next(i for i, t in enumerate(out.token_ids) if t in nameless)
            lp = llm.create_completion(prompt, max_tokens=step + 1, temperature=0, logprobs=5)["choices"][0]["logprobs"]
            print(f"{pid}: the goldens' step {step} is id {out.token_ids[step]}; create_completion(logprobs=5) names "
                  f"the tokens {lp['tokens']}")
            return


PROBES = {"ct2-llama3-rope": ct2_llama3_rope, "ct2-llama-head-dim": ct2_llama_head_dim,
          "ct2-mistral-unk": ct2_mistral_unk, "ort-head-size": ort_head_size, "llamacpp-echo": llamacpp_echo,
          "llamacpp-wordlevel": llamacpp_wordlevel, "llamacpp-byte-tokens": llamacpp_byte_tokens}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PROBES:
        print(f"usage: python -m tools.probe_peer_bugs {{{','.join(PROBES)}}}", file=sys.stderr)
        sys.exit(2)
    PROBES[sys.argv[1]]()
