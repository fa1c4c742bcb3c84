"""transformers' sampling on the golden checkpoints: its logits processors on its logits, the reference that
golden/make_sampling.py records and that the oracle (nanovllm_ref.oracle.sampling_reference) samples against live.

`ReferenceSampler.scores(prompt, history, params)` is the processed distribution of the next token after
`prompt + history` for a request with vLLM-named `params`, computed by transformers' own processors in its
order (SequenceBias, RepetitionPenalty, MinNewTokensLength; Temperature, TopK, TopP, MinP), with the OpenAI /
vLLM presence and frequency penalties (absent from transformers) after the repetition penalty, as vLLM does.
References: transformers generation/logits_process.py; vLLM v1/sample/ops/penalties.py.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import torch


def eos_ids(model_path: str) -> list[int]:
    """The checkpoint's EOS ids (config.json and generation_config.json), as engines stop on them."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(model_path, name)
        if os.path.isfile(path):
            with open(path) as f:
                value = json.load(f).get("eos_token_id")
            ids.update([value] if isinstance(value, int) else (value or []))
    return sorted(ids)


class ReferenceSampler:
    """transformers' model (eager attention, CPU; logits cast to float32) and processors for one checkpoint."""

    def __init__(self, model_path: str, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=dtype, attn_implementation="eager").eval()
        self.eos = eos_ids(model_path)

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one reference per checkpoint, alive for the session)
    def logits(self, ids: tuple[int, ...]) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(input_ids=torch.tensor([ids])).logits[0, -1].float()  # (vocab,)

    def scores(self, prompt: list[int], history: list[int], params: dict[str, Any]) -> torch.Tensor:
        """(vocab,) float32 processed scores of the next token; -inf where the request cannot draw it."""
        return process(self.logits(tuple(prompt) + tuple(history)), prompt, history, params, self.eos)


def process(logits: torch.Tensor, prompt: list[int], history: list[int], params: dict[str, Any],
            eos: list[int]) -> torch.Tensor:
    """(vocab,) raw logits after prompt + history -> transformers' processed scores for `params` (vLLM names)."""
    from transformers.generation import logits_process as lp

    ids = torch.tensor([list(prompt) + list(history)])
    scores = logits.float().clone()[None]  # (1, vocab)
    bias = params.get("logit_bias")
    if bias:
        scores = lp.SequenceBiasLogitsProcessor({(int(t),): float(b) for t, b in bias.items()})(ids, scores)
    rep = float(params.get("repetition_penalty", 1.0))
    if rep != 1.0:
        scores = lp.RepetitionPenaltyLogitsProcessor(rep)(ids, scores)
    counts = torch.bincount(torch.tensor(list(history), dtype=torch.long), minlength=scores.shape[1])[None]
    scores = scores - params.get("frequency_penalty", 0.0) * counts - params.get("presence_penalty", 0.0) * (
        counts > 0)
    stops = list(params.get("stop_token_ids") or []) + ([] if params.get("ignore_eos") else eos)
    if params.get("min_tokens", 0) > len(history) and stops:
        scores = lp.MinNewTokensLengthLogitsProcessor(len(prompt), params["min_tokens"], stops)(ids, scores)
    temperature = float(params.get("temperature", 1.0))
    if temperature == 0:
        return scores[0]
    warpers = []
    if temperature != 1.0:
        warpers.append(lp.TemperatureLogitsWarper(temperature))
    if params.get("top_k", -1) > 0:
        warpers.append(lp.TopKLogitsWarper(params["top_k"]))
    if params.get("top_p", 1.0) < 1.0:
        warpers.append(lp.TopPLogitsWarper(float(params["top_p"])))
    if params.get("min_p", 0.0) > 0:
        warpers.append(lp.MinPLogitsWarper(float(params["min_p"])))
    for warper in warpers:
        scores = warper(ids, scores)
    return scores[0]
