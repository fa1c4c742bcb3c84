"""Built-in adapters for vLLM (``--engine vllm``) and SGLang (``--engine sglang``), offline engines in-process.

Both run greedy decoding (temperature 0, EOS ignored) on token-id prompts and return the top-N logprobs of
every generated step and of every prompt position, in the structure of :class:`EngineOutput`:

- vLLM: ``LLM(model, dtype).generate([TokensPrompt(prompt_token_ids=...)], SamplingParams(temperature=0,
  max_tokens, ignore_eos=True, logprobs=N, prompt_logprobs=N))``; a ``RequestOutput`` holds
  ``outputs[0].token_ids``, ``outputs[0].logprobs`` (one ``{token_id: Logprob}`` per step, the top-N plus the
  sampled token) and ``prompt_logprobs`` (``None`` at position 0, then top-N plus the actual prompt token).
  vLLM computes them from the raw logits by default, as the goldens do.
- SGLang: ``Engine(model_path, dtype).generate(input_ids=[...], sampling_params={"temperature": 0,
  "max_new_tokens", "ignore_eos": True}, return_logprob=True, top_logprobs_num=N, logprob_start_len=0)``;
  ``meta_info`` holds ``output_token_logprobs`` / ``input_token_logprobs`` as ``(logprob, token_id, text)``
  and ``output_top_logprobs`` / ``input_top_logprobs`` as lists of those per position (``None`` first).

The conversion functions take plain objects of those shapes, so they are tested without the engines.
Neither package is a dependency: the adapter raises an ImportError saying what to install.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .compare import EngineOutput

_DTYPES = ("float32", "bfloat16", "float16")


def _require(module: str, engine: str, dtype: str) -> Any:
    """The engine's package; also checks the dtype asked for."""
    import importlib

    try:
        package = importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"--engine {engine} needs the {engine!r} package ({e}); pip install {engine}") from e
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {_DTYPES}")
    return package


def _logprob(value: Any) -> float:
    """A vLLM ``Logprob`` (``.logprob``), a ``{"logprob": x}`` dict, or a number."""
    if isinstance(value, Mapping):
        return float(value["logprob"])
    return float(getattr(value, "logprob", value))


def _step_dict(entry: Mapping[int, Any] | None) -> dict[int, float] | None:
    return None if entry is None else {int(t): _logprob(v) for t, v in entry.items()}


def vllm_output_to_engine_output(request_output: Any) -> EngineOutput:
    """One vLLM ``RequestOutput`` (or any object of its shape) as an :class:`EngineOutput`."""
    completion = request_output.outputs[0]
    if completion.logprobs is None:
        raise ValueError(f"vLLM request {getattr(request_output, 'request_id', '?')} has no logprobs: "
                         "SamplingParams(logprobs=N) is required")
    topk = [_step_dict(step) for step in completion.logprobs]
    if any(step is None for step in topk):
        raise ValueError("vLLM returned a generated step without logprobs")
    prompt = request_output.prompt_logprobs
    prompt_lps = None if prompt is None else [_step_dict(p) for p in prompt]
    cached = getattr(request_output, "num_cached_tokens", None)
    return EngineOutput(list(completion.token_ids), topk, prompt_lps, cached)


def _sglang_positions(top: Iterable[Sequence | None] | None) -> list[dict[int, float] | None]:
    return [None if not pos else {int(e[1]): float(e[0]) for e in pos if e[0] is not None} for pos in top or []]


def sglang_output_to_engine_output(result: Mapping[str, Any], prompt_logprobs: bool = True) -> EngineOutput:
    """One SGLang ``Engine.generate`` result (``{"meta_info": {...}, ...}``) as an :class:`EngineOutput`.

    The actual token of every step / prompt position is added to that position's top-N dict (vLLM's format,
    which the comparison expects); prompt position 0 is ``None``."""
    meta = result["meta_info"]
    if "output_token_logprobs" not in meta or "output_top_logprobs" not in meta:
        raise ValueError("SGLang returned no logprobs: return_logprob=True and top_logprobs_num=N are required")
    tokens = [int(e[1]) for e in meta["output_token_logprobs"]]
    topk = _sglang_positions(meta["output_top_logprobs"])
    for step, (lp, tok, *_) in zip(topk, meta["output_token_logprobs"]):
        if step is None:
            raise ValueError("SGLang returned a generated step without top logprobs")
        step[int(tok)] = float(lp)
    prompt_lps = None
    if prompt_logprobs:
        chosen = meta.get("input_token_logprobs")
        top = meta.get("input_top_logprobs")
        if chosen is None or top is None:
            raise ValueError("SGLang returned no prompt logprobs: logprob_start_len=0 is required")
        prompt_lps = _sglang_positions(top)
        if len(prompt_lps) != len(chosen):
            raise ValueError(f"SGLang returned {len(chosen)} prompt token logprobs but {len(prompt_lps)} top lists")
        for i, (lp, tok, *_) in enumerate(chosen):
            if i == 0:
                prompt_lps[0] = None  # nothing predicts the first prompt token
            elif lp is not None:
                prompt_lps[i] = {**(prompt_lps[i] or {}), int(tok): float(lp)}
    cached = meta.get("cached_tokens")
    return EngineOutput(tokens, topk, prompt_lps, int(cached) if cached is not None else None)


class VLLMAdapter:
    """vLLM's offline ``LLM``; ``engine_kwargs`` go to it (tensor_parallel_size, gpu_memory_utilization...)."""

    name = "vllm"

    def __init__(self, model_path: str, dtype: str = "bfloat16", **engine_kwargs: Any) -> None:
        vllm = _require("vllm", "vllm", dtype)
        self.llm = vllm.LLM(model=model_path, dtype=dtype, **engine_kwargs)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=top_k,
                                prompt_logprobs=top_k if prompt_logprobs else None)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        return [vllm_output_to_engine_output(o) for o in outs]

    @staticmethod
    def prefix_cache_kwargs(block_size: int, num_blocks: int, max_model_len: int) -> dict[str, Any]:
        """``LLM`` kwargs for a prefix cache of ``num_blocks`` usable blocks: vLLM keeps one more, its null block."""
        return {"block_size": block_size, "num_gpu_blocks_override": num_blocks + 1, "max_model_len": max_model_len,
                "enable_prefix_caching": True}

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()  # vllm.LLM's own

    @staticmethod
    def speculative_configs(model_path: str) -> dict[str, dict[str, Any]]:
        """Prompt lookup with 1 and 3 drafts (``LLM(speculative_config=...)``), with stat logging on: vLLM's
        ``LLM.get_metrics()`` needs it for the spec_decode counters."""
        from .spec_decode import ngram_configs

        return ngram_configs((1, 3), disable_log_stats=False)

    def spec_decode_stats(self) -> tuple[int, int, int] | None:
        """vLLM's counters ``vllm:spec_decode_num_draft_tokens``, ``_num_accepted_tokens`` and ``_num_drafts``
        (``LLM.get_metrics()``); None where stat logging is off or the engine does not speculate."""
        try:
            metrics = self.llm.get_metrics()
        except AssertionError:  # "Stat logging disabled": LLM(disable_log_stats=True), vLLM's offline default
            return None
        values: dict[str, int] = {}
        for m in metrics:
            if m.name.startswith("vllm:spec_decode_num_") and hasattr(m, "value"):
                values[m.name] = values.get(m.name, 0) + int(m.value)
        names = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
                 "vllm:spec_decode_num_drafts")
        return tuple(values[n] for n in names) if all(n in values for n in names) else None

    def run_requests(self, requests: list) -> list:
        """Requests with their own settings (oracle/requests.py), passed to vLLM's SamplingParams by name. vLLM's
        logprobs_mode is an engine setting (LLM(logprobs_mode=...), e.g. through --engine-arg): a request asking
        for another mode is an UnsupportedSetting, as is a name vLLM's SamplingParams refuses."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from .requests import UNREPORTED, Completion, UnsupportedSetting

        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        mode = getattr(getattr(config, "logprobs_mode", "raw_logprobs"), "value", None) or str(
            getattr(config, "logprobs_mode", "raw_logprobs"))
        params = []
        for r in requests:
            kwargs = dict(r.params)
            if kwargs.pop("logprobs_mode", mode) != mode:
                raise UnsupportedSetting(f"vLLM's logprobs_mode is the engine's ({mode}), not per request")
            try:
                params.append(SamplingParams(**_vllm_structured(kwargs)))
            except (TypeError, ValueError) as e:  # an unknown name, or a combination vLLM refuses (greedy n > 1)
                raise UnsupportedSetting(f"vLLM's SamplingParams: {e}") from None
        try:
            from vllm.exceptions import VLLMValidationError
        except ImportError:  # an older vLLM: its refusals stay errors
            VLLMValidationError = ()  # noqa: N806

        try:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(r.prompt)) for r in requests], params,
                                     use_tqdm=False)
        except VLLMValidationError as e:  # refused when added: "min_p and logit_bias ... not yet supported with
            # speculative decoding" (vLLM 0.32's SamplingParams._validate_spec_decode)
            raise UnsupportedSetting(f"vLLM refuses the request: {' '.join(str(e).split())}") from None
        return [[Completion(list(c.token_ids), c.finish_reason,
                            None if c.logprobs is None else [_step_dict(step) for step in c.logprobs],
                            None if o.prompt_logprobs is None else [_step_dict(p) for p in o.prompt_logprobs],
                            getattr(o, "num_cached_tokens", None), c.text, getattr(c, "stop_reason", UNREPORTED))
                 for c in o.outputs]
                for o in outs]

    def stream_requests(self, requests: list) -> list:
        """The requests streamed through vLLM's LLMEngine (``output_kind=RequestOutputKind.DELTA``): each step's
        outputs carry each completion's new tokens and text; the last one its finish and stop reasons."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from .requests import UNREPORTED, Completion, StreamedCompletion

        engine = self.llm.llm_engine
        ids = [f"text-stream-{i}" for i in range(len(requests))]
        for rid, r in zip(ids, requests):
            kwargs = {k: v for k, v in r.params.items() if k != "logprobs_mode"}
            engine.add_request(rid, TokensPrompt(prompt_token_ids=list(r.prompt)),
                               SamplingParams(**_vllm_structured(kwargs), output_kind=RequestOutputKind.DELTA))
        state = {rid: [StreamedCompletion(Completion([], "", text="")) for _ in range(r.params.get("n", 1))]
                 for rid, r in zip(ids, requests)}
        while engine.has_unfinished_requests():
            for out in engine.step():
                for c in out.outputs:
                    s = state[out.request_id][c.index]
                    s.completion.token_ids += list(c.token_ids)
                    if c.text:
                        s.pieces.append(c.text)
                        s.completion.text += c.text
                    if c.finish_reason is not None:
                        s.completion.finish_reason = c.finish_reason
                        s.completion.stop_reason = getattr(c, "stop_reason", UNREPORTED)
        return [state[rid] for rid in ids]

    def close(self) -> None:
        """Shut vLLM's engine down now (its engine-core process and memory), not at interpreter exit."""
        import gc

        llm, self.llm = self.llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and callable(getattr(core, "shutdown", None)):
            core.shutdown()
        del llm
        gc.collect()


def _vllm_structured(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with a ``structured_outputs`` dict as vLLM's ``StructuredOutputsParams`` (vLLM >= 0.11's name)."""
    spec = kwargs.get("structured_outputs")
    if spec is None:
        return kwargs
    from .requests import UnsupportedSetting

    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        raise UnsupportedSetting("this vLLM has no vllm.sampling_params.StructuredOutputsParams") from None
    return {**kwargs, "structured_outputs": StructuredOutputsParams(**spec)}


class SGLangAdapter:
    """SGLang's offline ``Engine``; ``engine_kwargs`` go to it (tp_size, mem_fraction_static...)."""

    name = "sglang"

    def __init__(self, model_path: str, dtype: str = "bfloat16", **engine_kwargs: Any) -> None:
        sgl = _require("sglang", "sglang", dtype)
        self.engine = sgl.Engine(model_path=model_path, dtype=dtype, **engine_kwargs)

    def generate(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                 prompt_logprobs: bool) -> list[EngineOutput]:
        params = {"temperature": 0.0, "max_new_tokens": max_tokens, "ignore_eos": True}
        results = self.engine.generate(input_ids=[list(p) for p in prompts], sampling_params=params,
                                       return_logprob=True, top_logprobs_num=top_k,
                                       logprob_start_len=0 if prompt_logprobs else -1)
        return [sglang_output_to_engine_output(r, prompt_logprobs) for r in results]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        self.engine = None
