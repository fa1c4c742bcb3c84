"""ONNX Runtime GenAI (``--engine ortgenai``): its model builder, then ``onnxruntime_genai.Generator`` in-process.

Conversion: ``python -m onnxruntime_genai.models.builder -i CKPT -o DIR -p fp32|int4 -e cpu`` (its builders for
Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM, MistralForCausalLM; no Qwen3-MoE), once per checkpoint and
precision (oracle/converted.py). ``--engine-arg quantization=int4`` runs the int4 export (MatMulNBits weights,
the builder's defaults), compared with the float32 goldens under the ``ort-int4`` tier (tolerances.py).

Generation: ``Generator.append_tokens(prompt)`` runs the prompt; ``get_output("logits")`` is then
``[1, len(prompt), vocab]`` (the prompt logprobs and the first step's); each chosen token is appended the same
way and its logits read. The adapter takes the argmax itself (lowest id on ties), because the engine's own search
cannot be observed raw: ``generate_next_token()`` processes the logits buffer that ``get_output`` returns in
place (with ``min_length``, which is the only way to keep EOS from ending the search, it writes -FLT_MAX over the
EOS logit) and runs a sampled token's forward only at the next call. One prompt at a time (no padding).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .compare import EngineOutput
from .converted import checked_engine, convert_once, log_softmax, prompt_logprob_dicts, run_converter, topk_dict

ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
PRECISIONS = {None: "fp32", "int4": "int4"}  # --engine-arg quantization -> the builder's --precision


def convert(checkpoint: str, quantization: str | None = None) -> Path:
    """The ONNX export of ``checkpoint`` for the CPU (cached)."""
    precision = PRECISIONS[quantization]

    def build(src: Path, out: Path) -> None:
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", src, "-o", out / "model",
               "-p", precision, "-e", "cpu", "-c", out / "hf-cache"]
        run_converter(cmd, out)

    return convert_once("ortgenai", precision, checkpoint, build, "model/genai_config.json") / "model"


class OrtGenAIAdapter:
    """``onnxruntime_genai`` on the export of ``model_path`` (a Hugging Face checkpoint, exported here)."""

    name = "ortgenai"

    def __init__(self, model_path: str, dtype: str = "float32", quantization: str | None = None) -> None:
        og = checked_engine(
            "ortgenai", "onnxruntime_genai", "onnxruntime-genai onnx onnx-ir", model_path, dtype, quantization,
            quantizations=PRECISIONS, architectures=ARCHITECTURES, converter="ONNX Runtime GenAI's model builder",
            dtype_why="the adapter exports fp32 for the CPU (or int4: --engine-arg quantization=int4, compared with "
            "the float32 goldens)")
        self.quantization = None if quantization is None else f"ort-{quantization}"
        self.model_dir = convert(model_path, quantization)
        self.og, self.model = og, og.Model(str(self.model_dir))
        self.version = og.__version__

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        return [self._one(list(p), max_tokens, top_k, prompt_logprobs) for p in prompts]

    def _one(self, prompt: list[int], max_tokens: int, top_k: int, want_prompt: bool) -> EngineOutput:
        import numpy as np

        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + max_tokens, do_sample=False)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(np.array([prompt], dtype=np.int32))
        rows = log_softmax(gen.get_output("logits")[0])  # [len(prompt), vocab]
        out = EngineOutput([], [], prompt_logprob_dicts(rows, prompt, top_k) if want_prompt else None)
        last = rows[-1]
        for step in range(max_tokens):
            d = topk_dict(last, top_k)
            tok = next(iter(d))
            out.token_ids.append(tok)
            out.topk.append(d)
            if step + 1 < max_tokens:
                gen.append_tokens(np.array([[tok]], dtype=np.int32))
                last = log_softmax(gen.get_output("logits")[0, -1])
        return out

    def close(self) -> None:
        self.model = None
