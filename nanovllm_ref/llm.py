"""The user-facing entry point: `LLM(model, **config).generate(prompts, sampling_params)` and `.chat(messages)`.

`model` is a checkpoint folder (a golden checkpoint's name is the caller's to resolve: golden.load.resolve_model,
as the CLI and the oracle do). The prompt forms and
the `chat` signature follow vLLM's `LLM`: one prompt or a list; a text, token ids, or a
`{"prompt": ...}` / `{"prompt_token_ids": ...}` dict; one conversation (OpenAI-style messages) or a list of them.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from tqdm.auto import tqdm

from .config import Config
from .engine.llm_engine import LLMEngine
from .engine.observers import EngineStats
from .outputs import RequestOutput
from .sampling_params import RequestOutputKind, SamplingParams

Prompt = str | list[int] | dict


class LLM:
    def __init__(self, model: str | os.PathLike, **config: Any) -> None:
        self.model_name = str(model)  # as given (the served name's default)
        path = os.fspath(model) if isinstance(model, os.PathLike) else model
        self.config = Config.from_kwargs(path, **config)
        self.engine = LLMEngine(self.config)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None, use_tqdm: bool = True,
                 ) -> list[RequestOutput]:
        """Generate for every prompt (a single one too); results come back in input order: each request's final
        output (its n samples), whatever its `output_kind` (as vLLM's `LLM.generate`)."""
        prompts = [_prompt(p) for p in _prompt_list(prompts)]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if not isinstance(sampling_params, (list, tuple)) or len(sampling_params) != len(prompts):
            got = len(sampling_params) if isinstance(sampling_params, (list, tuple)) else sampling_params
            raise ValueError(f"sampling_params must be one SamplingParams or a list of {len(prompts)}, got {got!r}")
        sampling_params = _final_only(sampling_params)
        # all checked (and text tokenized, once) before any is added
        token_ids = [self.engine.validate_request(p, sp) for p, sp in zip(prompts, sampling_params)]
        ids = [self.engine.add_validated(t, sp) for t, sp in zip(token_ids, sampling_params)]
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Generating", dynamic_ncols=True, disable=not use_tqdm)
        start, num_out = time.perf_counter(), 0
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if not out.finished:  # (a request added through the step API, streaming meanwhile)
                    continue
                results[out.request_id] = out
                num_out += len(out.token_ids)
                bar.update(1)
                bar.set_postfix(out_tok_s=f"{num_out / (time.perf_counter() - start):.0f}")
        bar.close()
        return [results[i] for i in ids]

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict[str, Any] | None = None,
             ) -> list[RequestOutput]:
        """Reply to one conversation or to each of a list, rendered with the checkpoint's chat template (or
        `chat_template`); as vLLM's `LLM.chat`."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise TypeError("messages must be a conversation (a list of message dicts) or a list of them")
        conversations = messages if isinstance(messages[0], (list, tuple)) else [messages]
        options = dict(add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                       **(chat_template_kwargs or {}))
        from .chat_template import render_chat  # (the server's and the chat CLI's renderer too)

        texts = [render_chat(self.tokenizer, c, chat_template, **options) for c in conversations]
        # the template writes its own special tokens (BOS included)
        ids = [list(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts]
        return self.generate(ids, sampling_params, use_tqdm)

    # step-level API (LLMEngine's)
    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None) -> str:
        return self.engine.add_request(prompt, params, request_id)

    def step(self) -> list[RequestOutput]:
        """One engine step: an output for every request that advanced in it, per its `output_kind`."""
        return self.engine.step()

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def abort_request(self, request_id: str) -> RequestOutput | None:
        return self.engine.abort_request(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _final_only(params: list[Any]) -> list[Any]:
    """The params with output_kind FINAL_ONLY (generate reads final outputs only: nothing is built per step), one
    copy per distinct SamplingParams; anything else is left for validate_request to refuse."""
    copies: dict[int, SamplingParams] = {}
    for sp in params:
        if isinstance(sp, SamplingParams) and id(sp) not in copies:
            copies[id(sp)] = dataclasses.replace(sp, output_kind=RequestOutputKind.FINAL_ONLY)
    return [copies.get(id(sp), sp) for sp in params]


def _prompt_list(prompts: Any) -> list:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError("prompts must be a prompt (a str, token ids or a prompt dict) or a list of them")
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]  # one token-id prompt
    return list(prompts)


def _prompt(prompt: Any) -> str | list[int]:
    """A vLLM prompt dict ({"prompt": text} or {"prompt_token_ids": ids}) as the text or the ids."""
    if not isinstance(prompt, dict):
        return prompt
    if set(prompt) not in ({"prompt"}, {"prompt_token_ids"}):
        raise TypeError(f"a prompt dict has either 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
    return next(iter(prompt.values()))
