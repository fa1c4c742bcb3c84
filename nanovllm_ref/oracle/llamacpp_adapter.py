"""llama.cpp through llama-cpp-python (``--engine llamacpp``): ``convert_hf_to_gguf.py``, then ``llama_cpp.Llama``.

Conversion: llama.cpp's ``convert_hf_to_gguf.py CKPT --outfile M.gguf --outtype f32|bf16|q8_0`` (its ``conversion/``
package and ``gguf-py`` on the path), once per checkpoint and type (oracle/converted.py). llama-cpp-python's source
distribution carries them in ``vendor/llama.cpp``; the adapter finds that folder through ``--engine-arg
llama_cpp_dir=DIR`` or ``$LLAMA_CPP_DIR``. ``--engine-arg quantization=q8_0`` (or ``bf16``) converts to that type,
compared with the float32 goldens under the ``gguf-q8_0`` / ``gguf-bf16`` tier (tolerances.py); without it f32.

The converter names a BPE tokenizer's pre-tokenizer by hashing its output on a test string and refuses an unknown
hash; the goldens' 1,536-token tokenizers are unknown to it, so for those (and only those: a known hash is kept)
the name is taken from the tokenizer's split regex (:data:`PRE_TOKENIZERS`; Qwen2's regex -> ``qwen2``), else
``default``. The engine is given token ids, so the name only matters to text prompts.

Generation: ``Llama(model_path, logits_all=True, n_ctx=..., n_threads=1, type_k=F32, type_v=F32)``: llama.cpp's KV
cache is f16 by default, which alone moves float32 logprobs by ~1e-3 (10x the float32 tolerance; qwen3-tiny: 23/23
prompts over it, every token still equal), so the adapter asks for an f32 cache (``--engine-arg kv_cache_type=f16``:
llama.cpp's default); per prompt ``Llama.generate(prompt,
temp=0, top_k=1, top_p=1, min_p=0, repeat_penalty=1)`` (llama.cpp's greedy sampler; the generator never stops at
EOS, ``create_completion`` is what stops) while ``Llama.scores[i]`` holds the raw logits after token ``i`` (every
prompt position too, with ``logits_all``). ``generate`` keeps the KV cache of the longest prefix shared with the
previous request, so the goldens' shared-prefix prompts run through llama.cpp's prefix reuse.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .compare import EngineOutput
from .converted import checked_engine, convert_once, greedy_output, log_softmax, prompt_logprob_dicts, run_converter

ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                 "Qwen3MoeForCausalLM")
OUTTYPES = {None: "f32", "bf16": "bf16", "q8_0": "q8_0"}  # --engine-arg quantization -> --outtype
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")
PRE_TOKENIZERS = {QWEN2_SPLIT: "qwen2"}  # a tokenizer.json Split regex -> llama.cpp's pre-tokenizer name

# runs the converter with get_vocab_base_pre falling back to the regex's name (argv: DIR, PRE, converter args)
_CONVERTER = """
import sys
root, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [root, root + "/gguf-py"]
sys.argv = [root + "/convert_hf_to_gguf.py"] + sys.argv[3:]
import conversion.base as base
known = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        print(f"[nanovllm_ref] unknown BPE pre-tokenizer hash: using {pre!r} (from the tokenizer's split regex)")
        return pre
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def llama_cpp_dir(given: str | None = None) -> Path:
    """The llama.cpp source folder holding convert_hf_to_gguf.py (argument, else $LLAMA_CPP_DIR)."""
    d = given or os.environ.get("LLAMA_CPP_DIR")
    if not d or not (Path(d) / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"llama.cpp's convert_hf_to_gguf.py not found in {d!r}: pass --engine-arg "
                                "llama_cpp_dir=DIR or set LLAMA_CPP_DIR (llama-cpp-python's sdist has it in "
                                "vendor/llama.cpp)")
    return Path(d)


def pre_tokenizer_name(checkpoint: str | os.PathLike) -> str:
    """llama.cpp's pre-tokenizer name for the checkpoint's tokenizer.json split regex (``default`` if unknown)."""
    path = Path(checkpoint) / "tokenizer.json"
    if not path.is_file():
        return "default"
    pre = json.loads(path.read_text()).get("pre_tokenizer") or {}
    for p in pre.get("pretokenizers", [pre]):
        regex = (p.get("pattern") or {}).get("Regex") if p.get("type") == "Split" else None
        if regex in PRE_TOKENIZERS:
            return PRE_TOKENIZERS[regex]
    return "default"


def convert(checkpoint: str, quantization: str | None = None, source_dir: str | None = None) -> Path:
    """The GGUF file of ``checkpoint`` (cached) in f32, bf16 or q8_0."""
    outtype, root = OUTTYPES[quantization], llama_cpp_dir(source_dir)

    def build(src: Path, out: Path) -> None:
        cmd = [sys.executable, "-c", _CONVERTER, root, pre_tokenizer_name(src), src, "--outfile", out / "model.gguf",
               "--outtype", outtype]
        run_converter(cmd, out)

    return convert_once("llamacpp", outtype, checkpoint, build, "model.gguf") / "model.gguf"


def steps_of(scores: Any, n_prompt: int, n_tokens: int) -> Any:
    """The log-prob rows that chose each of the ``n_tokens`` generated tokens: rows n_prompt-1 ... (numpy)."""
    return log_softmax(scores[n_prompt - 1:n_prompt - 1 + n_tokens])


class LlamaCppAdapter:
    """llama-cpp-python's ``Llama`` on the GGUF conversion of ``model_path``."""

    name = "llamacpp"

    def __init__(self, model_path: str, dtype: str = "float32", quantization: str | None = None,
                 llama_cpp_dir: str | None = None, n_ctx: int = 512, n_threads: int = 1,
                 kv_cache_type: str = "f32") -> None:
        llama_cpp = checked_engine(
            "llamacpp", "llama_cpp", "llama-cpp-python", model_path, dtype, quantization, quantizations=OUTTYPES,
            architectures=ARCHITECTURES, converter="llama.cpp's convert_hf_to_gguf.py (as the adapter runs it)",
            dtype_why="GGUF types are chosen with --engine-arg quantization=bf16|q8_0 and compared with the float32 "
            "goldens under their tier")
        if kv_cache_type not in ("f32", "f16"):
            raise ValueError(f"kv_cache_type {kv_cache_type!r}: use f32 or f16 (llama.cpp's default)")
        self.quantization = None if quantization is None else f"gguf-{quantization}"
        self.gguf = convert(model_path, quantization, llama_cpp_dir)
        kv = llama_cpp.GGML_TYPE_F32 if kv_cache_type == "f32" else llama_cpp.GGML_TYPE_F16
        self.llm = llama_cpp.Llama(str(self.gguf), n_ctx=n_ctx, logits_all=True, n_threads=n_threads,
                                   n_threads_batch=n_threads, type_k=kv, type_v=kv, verbose=False)
        self.version = llama_cpp.__version__

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        return [self._one(list(p), max_tokens, top_k, prompt_logprobs) for p in prompts]

    def _one(self, prompt: list[int], max_tokens: int, top_k: int, want_prompt: bool) -> EngineOutput:
        if len(prompt) + max_tokens > self.llm.n_ctx():
            raise ValueError(f"prompt of {len(prompt)} + {max_tokens} tokens exceeds n_ctx {self.llm.n_ctx()}: "
                             "pass --engine-arg n_ctx=N")
        tokens = []
        for tok in self.llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            tokens.append(int(tok))
            if len(tokens) == max_tokens:
                break
        scores = self.llm.scores  # [n_ctx, vocab] raw logits; rows < n_tokens are this sequence's
        out = greedy_output(steps_of(scores, len(prompt), len(tokens)), tokens, top_k)
        if want_prompt:
            out.prompt_logprobs = prompt_logprob_dicts(log_softmax(scores[:len(prompt) - 1]), prompt, top_k)
        return out

    def close(self) -> None:
        if self.llm is not None:
            self.llm.close()
        self.llm = None
