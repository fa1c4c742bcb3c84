"""CTranslate2 (``--engine ctranslate2``): its Transformers converter, then ``ctranslate2.Generator`` in-process.

Conversion: ``ct2-transformers-converter --model CKPT --output_dir DIR [--quantization int8]`` (its loaders for
Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM, MistralForCausalLM), once per checkpoint and quantization
(oracle/converted.py). ``--engine-arg quantization=int8`` runs the int8 conversion (``compute_type="int8"``: int8
weights and int8 GEMMs on the CPU), compared with the float32 goldens under the ``ct2-int8`` tier (tolerances.py);
without it the float32 conversion in float32. This CPU build offers float32, int8 and int8_float32 only, so there
is no bfloat16 row.

Generation: ``Generator.generate_batch(start_tokens, max_length=N, sampling_topk=1, include_prompt_in_result=False,
return_logits_vocab=True, end_token=[])`` (greedy, EOS never ends it, the full logits of every step), one call per
group of prompts of equal length: for prompts of different lengths it forwards only the shortest length at once
and *generates* the rest of each longer prompt by constrained decoding, which the result then holds and which
counts against ``max_length`` (its documented behaviour). Prompt logprobs: ``Generator.forward_batch(ids,
return_log_probs=True)`` (``[batch, length, vocab]``). Start tokens are token strings: ids map through the
converted ``vocabulary.json`` (one string per id; a vocabulary with repeated strings is refused).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from .compare import EngineOutput
from .converted import checked_engine, convert_once, greedy_output, log_softmax, prompt_logprob_dicts, run_converter

ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
QUANTIZATIONS = {None: "float32", "int8": "int8"}  # --engine-arg quantization -> compute_type
_CONVERTER = "import sys; from ctranslate2.converters.transformers import main; sys.argv[0] = 'ct2'; main()"


def convert(checkpoint: str, quantization: str | None = None) -> Path:
    """The CTranslate2 model of ``checkpoint`` (cached): float32 weights, or int8 ones."""
    def build(src: Path, out: Path) -> None:
        model = out / "model"
        cmd = [sys.executable, "-c", _CONVERTER, "--model", src, "--output_dir", model, "--force"]
        run_converter(cmd + (["--quantization", quantization] if quantization else []), out)
        null_unk_token(model / "config.json", out / "convert.log")

    return convert_once("ctranslate2", quantization or "float32", checkpoint, build, "model/model.bin") / "model"


def null_unk_token(config_json: Path, log: Path) -> None:
    """CTranslate2 4.8's MistralLoader writes the tokenizer's ``unk_token`` as is, ``null`` for a tokenizer without
    one (byte-level BPE), and its runtime then refuses the model (``[json.exception.type_error.302] type must be
    string, but is null``); the LlamaLoader writes ``""`` there. Write ``""`` too, and say so in the log, so that the
    model's arithmetic can still be compared (conformance/README.md, "Peers", lists the converter bug)."""
    config = json.loads(config_json.read_text())
    if "unk_token" in config and config["unk_token"] is None:
        config["unk_token"] = ""
        config_json.write_text(json.dumps(config, indent=2))
        with log.open("a") as f:
            f.write("[nanovllm_ref] config.json: unk_token null -> \"\" (CTranslate2's runtime refuses null)\n")


def token_strings(vocabulary: list[str]) -> list[str]:
    """The converted vocabulary (id -> string); CTranslate2 takes start tokens as strings, so two ids with one
    string would be indistinguishable."""
    if len(set(vocabulary)) != len(vocabulary):
        dup = next(t for t in vocabulary if vocabulary.count(t) > 1)
        raise ValueError(f"CTranslate2's vocabulary.json repeats the token string {dup!r}: ids cannot be passed")
    return vocabulary


def step_rows(result: Any) -> list[Any]:
    """The log-softmax of every generated step's logits of one ``GenerationResult`` (first hypothesis)."""
    import numpy as np

    return [log_softmax(np.array(step)) for step in result.logits[0]]


def length_groups(prompts: list[list[int]]) -> dict[int, list[int]]:
    """Indices of the prompts by length (one ``generate_batch`` per length: see the module docstring)."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        groups[len(p)].append(i)
    return dict(groups)


class CTranslate2Adapter:
    """``ctranslate2.Generator`` on the converted ``model_path`` (a Hugging Face checkpoint, converted here)."""

    name = "ctranslate2"

    def __init__(self, model_path: str, dtype: str = "float32", quantization: str | None = None,
                 inter_threads: int = 1, intra_threads: int = 1) -> None:
        ctranslate2 = checked_engine(
            "ctranslate2", "ctranslate2", "ctranslate2", model_path, dtype, quantization, quantizations=QUANTIZATIONS,
            architectures=ARCHITECTURES, converter="CTranslate2's Transformers converter (ct2-transformers-converter)",
            dtype_why="CTranslate2's CPU build computes in float32 (or int8: --engine-arg quantization=int8, compared "
            "with the float32 goldens)")
        self.quantization = None if quantization is None else f"ct2-{quantization}"
        self.model_dir = convert(model_path, quantization)
        self.vocab = token_strings(json.loads((self.model_dir / "vocabulary.json").read_text()))
        self.generator = ctranslate2.Generator(str(self.model_dir), device="cpu",
                                               compute_type=QUANTIZATIONS[quantization],
                                               inter_threads=inter_threads, intra_threads=intra_threads)
        self.version = ctranslate2.__version__

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        outputs: list[EngineOutput | None] = [None] * len(prompts)
        for _, idx in sorted(length_groups(prompts).items()):
            group = [prompts[i] for i in idx]
            results = self.generator.generate_batch(
                [[self.vocab[t] for t in p] for p in group], max_length=max_tokens, sampling_topk=1,
                include_prompt_in_result=False, return_logits_vocab=True, end_token=[])
            rows = None
            if prompt_logprobs:
                import numpy as np

                rows = np.array(self.generator.forward_batch(group, return_log_probs=True))  # [batch, len, vocab]
            for j, (i, res) in enumerate(zip(idx, results)):
                out = greedy_output(step_rows(res), res.sequences_ids[0], top_k)
                if rows is not None:
                    out.prompt_logprobs = prompt_logprob_dicts(rows[j], prompts[i], top_k)
                outputs[i] = out
        return [o for o in outputs if o is not None]

    def close(self) -> None:
        self.generator = None
