"""Stand-ins for the packages of llama.cpp (``llama_cpp``), CTranslate2 (``ctranslate2``) and ONNX Runtime GenAI
(``onnxruntime_genai``): the calls the adapters make, with the shapes and semantics those packages document, backed
by transformers' float32 model of a golden checkpoint (full forwards, no cache). Installed into ``sys.modules`` by
:func:`install`, with each adapter's ``convert`` replaced by one that writes the checkpoint's path and, for
CTranslate2, its ``vocabulary.json``. ``BUMP`` adds a constant to one token's logits (a systematic error)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

BUMP: dict[str, float] = {}  # {"token": id, "by": x}: the perturbation, when set
_MODELS: dict[str, object] = {}


def logits_of(checkpoint: str, ids: list[int]) -> np.ndarray:
    """[len(ids), vocab] float32 logits of transformers (eager, float32) on ``ids``."""
    from transformers import AutoModelForCausalLM

    if checkpoint not in _MODELS:
        _MODELS[checkpoint] = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()
    with torch.inference_mode():
        out = _MODELS[checkpoint](input_ids=torch.tensor([ids])).logits[0].float().numpy().copy()
    if BUMP:
        out[:, BUMP["token"]] += BUMP["by"]
    return out


def _source(path: str | Path) -> str:
    p = Path(path)
    return (p if p.is_dir() else p.parent).joinpath("source.txt").read_text()


class CT2Generator:
    def __init__(self, model_dir: str, **kwargs: object) -> None:
        self.ckpt = _source(model_dir)
        self.ids = {t: i for i, t in enumerate(json.loads((Path(model_dir) / "vocabulary.json").read_text()))}

    def generate_batch(self, start_tokens, max_length, sampling_topk, include_prompt_in_result,
                       return_logits_vocab, end_token):
        assert sampling_topk == 1 and not include_prompt_in_result and return_logits_vocab and end_token == []
        shortest = min(len(s) for s in start_tokens)
        results = []
        for strings in start_tokens:
            ids = [self.ids[s] for s in strings]
            seq, steps, out = ids[:shortest], [], []
            while len(out) < max_length:  # the rest of a longer prompt is "generated" (constrained), as documented
                row = logits_of(self.ckpt, seq)[-1]
                tok = ids[len(seq)] if len(seq) < len(ids) else int(np.argmax(row))
                steps.append(row)
                out.append(tok)
                seq = seq + [tok]
            results.append(types.SimpleNamespace(sequences_ids=[out], logits=[steps]))
        return results

    def forward_batch(self, inputs, return_log_probs):
        assert len({len(x) for x in inputs}) == 1, "the stand-in forwards equal lengths (no padding)"
        return np.stack([torch.log_softmax(torch.tensor(logits_of(self.ckpt, list(x))), -1).numpy() for x in inputs])


class OGModel:
    def __init__(self, model_dir: str) -> None:
        self.ckpt = _source(model_dir)


class OGParams:
    def __init__(self, model: OGModel) -> None:
        self.model = model

    def set_search_options(self, **options: object) -> None:
        self.options = options


class OGGenerator:
    def __init__(self, model: OGModel, params: OGParams) -> None:
        self.ckpt, self.seq, self.new = model.ckpt, [], 0

    def append_tokens(self, tokens: np.ndarray) -> None:
        self.new = tokens.shape[1]
        self.seq += [int(t) for t in tokens[0]]

    def get_output(self, name: str) -> np.ndarray:
        assert name == "logits"
        return logits_of(self.ckpt, self.seq)[-self.new:][None]  # [1, appended, vocab]


class Llama:
    def __init__(self, model_path: str, n_ctx: int, logits_all: bool, **kwargs: object) -> None:
        assert logits_all and kwargs["type_k"] == kwargs["type_v"] == 0  # an f32 KV cache (GGML_TYPE_F32)
        self.ckpt, self._n_ctx, self.scores = _source(model_path), n_ctx, None

    def n_ctx(self) -> int:
        return self._n_ctx

    def generate(self, tokens, temp, top_k, top_p, min_p, repeat_penalty):
        assert temp == 0.0 and repeat_penalty == 1.0
        seq = list(tokens)
        while True:
            rows = logits_of(self.ckpt, seq)
            self.scores = np.zeros((self._n_ctx, rows.shape[1]), np.float32)
            self.scores[:len(seq)] = rows  # llama.cpp: one row per evaluated token
            tok = int(np.argmax(rows[-1]))
            yield tok
            seq.append(tok)

    def close(self) -> None:
        pass


def install(monkeypatch, tmp_path: Path) -> None:
    """The three stand-in packages in sys.modules and the adapters' ``convert`` writing pointers under tmp_path."""
    from nanovllm_ref.oracle import ctranslate2_adapter, llamacpp_adapter, ortgenai_adapter

    mods = {"ctranslate2": {"Generator": CT2Generator},
            "llama_cpp": {"Llama": Llama, "GGML_TYPE_F32": 0, "GGML_TYPE_F16": 1},
            "onnxruntime_genai": {"Model": OGModel, "GeneratorParams": OGParams, "Generator": OGGenerator}}
    for name, attrs in mods.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(__version__="stand-in", **attrs))

    def convert(checkpoint: str, quantization: str | None = None, *args: object) -> Path:
        d = tmp_path / f"{Path(checkpoint).name}-{quantization}"
        d.mkdir(exist_ok=True)
        (d / "source.txt").write_text(str(checkpoint))
        vocab = json.loads((Path(checkpoint) / "tokenizer.json").read_text())["model"]["vocab"]
        size = json.loads((Path(checkpoint) / "config.json").read_text())["vocab_size"]
        strings = [f"<extra_{i}>" for i in range(size)]
        for s, i in vocab.items():
            strings[i] = s
        (d / "vocabulary.json").write_text(json.dumps(strings))
        return d

    for module in (ctranslate2_adapter, ortgenai_adapter):
        monkeypatch.setattr(module, "convert", convert)
    monkeypatch.setattr(llamacpp_adapter, "convert", lambda c, q=None, d=None: convert(c, q) / "model.gguf")
