"""Engine adapters: one small interface through which the conformance suite drives any inference engine.

An adapter runs greedy decoding on token-id prompts with EOS disabled and returns, per prompt, the generated
tokens, the top-k logprobs of every step and (optionally) the prompt logprobs, as :class:`EngineOutput`.
Logprobs must be those of the raw model distribution (log-softmax of the float32 logits), as vLLM and
SGLang return them by default.

Built-ins: ``nanovllm_ref`` (:class:`NanovllmRefAdapter`), ``hf`` (:class:`HFAdapter`, transformers with
eager attention, one prompt at a time: the same arithmetic as the goldens, and the live reference), ``vllm``
and ``sglang`` (their offline engines, external_adapters.py), and servers by URL (:data:`SERVER_ADAPTERS`):
``openai:URL`` and ``trtllm:URL`` (openai_adapter.py), ``tgi:URL``, ``sglang:URL``, ``ollama:URL``
(server_adapters.py), each checking that the server runs ``--model`` in ``--dtype`` (served.py).
An adapter without logprobs says ``returns_logprobs = False`` (the policy's tokens-only mode), one without
prompt logprobs ``returns_prompt_logprobs = False``. Optional capabilities beyond ``generate``: ``run_requests``
(requests with their own settings; completions with text, finish and stop reasons) and ``stream_requests`` (the
same, streamed), oracle/requests.py; the cases that need one skip, with the reason, on an adapter without it.
Third-party engines plug in as ``"pkg.module:factory"``, a callable taking ``(model_path, dtype)`` and
returning an :class:`EngineAdapter`; or add a name to :data:`ADAPTERS`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .compare import EngineOutput
from .requests import Completion, RequestSpec, StreamedCompletion, UnsupportedSetting

# name -> "module:factory"; the factory is called with (model_path, dtype, **kwargs).
ADAPTERS: dict[str, str] = {
    "nanovllm_ref": "nanovllm_ref.oracle.adapters:NanovllmRefAdapter",
    "hf": "nanovllm_ref.oracle.adapters:HFAdapter",
    "vllm": "nanovllm_ref.oracle.external_adapters:VLLMAdapter",  # needs `pip install vllm`
    "sglang": "nanovllm_ref.oracle.external_adapters:SGLangAdapter",  # needs `pip install sglang`
    # engines with their own model format: the checkpoint is converted once (oracle/converted.py)
    "llamacpp": "nanovllm_ref.oracle.llamacpp_adapter:LlamaCppAdapter",  # needs `pip install llama-cpp-python`
    "ctranslate2": "nanovllm_ref.oracle.ctranslate2_adapter:CTranslate2Adapter",  # `pip install ctranslate2`
    "ortgenai": "nanovllm_ref.oracle.ortgenai_adapter:OrtGenAIAdapter",  # `pip install onnxruntime-genai`
}
# "<prefix>:<server url>" -> "module:class", called with (url, model_path, dtype, **kwargs)
SERVER_ADAPTERS: dict[str, str] = {
    "openai": "nanovllm_ref.oracle.openai_adapter:OpenAIAdapter",  # vLLM, SGLang, nanovllm_ref.serve
    "trtllm": "nanovllm_ref.oracle.openai_adapter:TrtllmAdapter",  # TensorRT-LLM's trtllm-serve
    "tgi": "nanovllm_ref.oracle.server_adapters:TGIAdapter",  # Hugging Face text-generation-inference
    "sglang": "nanovllm_ref.oracle.server_adapters:SGLangHTTPAdapter",  # SGLang's native /generate
    "ollama": "nanovllm_ref.oracle.server_adapters:OllamaAdapter",
    "llamacpp": "nanovllm_ref.oracle.llamacpp_server_adapter:LlamaCppServerAdapter",  # python -m llama_cpp.server
}


@runtime_checkable
class EngineAdapter(Protocol):
    """What the conformance suite needs from an engine.

    ``generate`` must be greedy (temperature 0), must not stop at EOS (exactly ``max_tokens`` tokens), and
    must return one :class:`EngineOutput` per prompt, in order, with ``topk[i]`` holding at least the
    ``top_k`` most likely tokens of step i with their logprobs, and, when ``prompt_logprobs`` is true,
    ``prompt_logprobs`` = ``[None, {top-k + actual token}, ...]`` (one entry per prompt position).
    """

    name: str

    def generate(
        self, prompts: list[list[int]], max_tokens: int, top_k: int, prompt_logprobs: bool
    ) -> list[EngineOutput]: ...

    def close(self) -> None: ...


class _DecisionCallback:
    """An engine observer passing each decision, numbered and converted, to a callback."""

    def __init__(self, callback: Callable[[Any], None], convert: Callable[[Any, int], Any]) -> None:
        self.callback, self.convert, self.steps = callback, convert, 0

    def on_schedule(self, decision: Any) -> None:
        self.callback(self.convert(decision, self.steps))
        self.steps += 1


class NanovllmRefAdapter:
    """nanovllm_ref's offline ``LLM``; ``engine_kwargs`` go to ``LLM`` (device, tensor_parallel_size,
    num_kvcache_blocks, ...). ``self.llm`` stays reachable for engine-specific checks (preemptions...)."""

    name = "nanovllm_ref"

    def __init__(self, model_path: str, dtype: str = "float32", **engine_kwargs: Any) -> None:
        from nanovllm_ref import LLM

        engine_kwargs.setdefault("device", "cpu")
        self.model_path, self.dtype, self.engine_kwargs = model_path, dtype, engine_kwargs
        self.llm = LLM(model_path, dtype=dtype, **engine_kwargs)
        self._observer: _DecisionCallback | None = None

    def generate(
        self, prompts: list[list[int]], max_tokens: int, top_k: int, prompt_logprobs: bool
    ) -> list[EngineOutput]:
        from nanovllm_ref import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=top_k,
                                prompt_logprobs=top_k if prompt_logprobs else None)
        outs = self.llm.generate([list(p) for p in prompts], params, use_tqdm=False)
        for o in outs:
            if o.error is not None:
                raise RuntimeError(f"nanovllm_ref request {o.request_id} failed: {o.error}")
        return [EngineOutput(list(o.token_ids), list(o.logprobs or []), o.prompt_logprobs, o.num_cached_tokens)
                for o in outs]

    def modes(self) -> dict[str, tuple[dict[str, Any], bool]]:
        """The engine modes it advertises besides this one: name -> (engine settings, whether the mode promises
        bitwise batch invariance); conformance/test_engine_modes.py runs the goldens in each. The fp8 KV cache has
        a tier of its own (conformance/test_fp8_kv.py)."""
        other = not self.llm.engine.async_scheduling  # async by default on CUDA, sync on the CPU: the other one
        return {"batch-invariant": ({"batch_invariant": True}, True),
                f"async-scheduling-{'on' if other else 'off'}": ({"async_scheduling": other}, False)}

    @staticmethod
    def speculative_configs(model_path: str) -> dict[str, dict[str, Any]]:
        """The speculative configs it is checked with (oracle/spec_decode.py: n-gram k = 1, 3, 5; draft models)."""
        from .spec_decode import nanovllm_ref_configs

        return nanovllm_ref_configs(model_path)

    def spec_decode_stats(self) -> tuple[int, int, int] | None:
        """(draft tokens, accepted tokens, verifications) since the engine started; None without speculation."""
        s = self.llm.stats().spec_decoding
        return None if s is None else (s.num_draft_tokens, s.num_accepted_tokens, s.num_drafts)

    def rejection_sampler(self) -> Callable:
        """The rejection sampler the engine draws with (its Triton kernel where it uses kernels, else the torch
        reference), taking and returning CPU tensors (oracle/rejection_check.py)."""
        from ..kernels.rejection import rejection_sample, rejection_sample_reference

        fn = rejection_sample if getattr(self.llm.engine.runner, "use_kernels", False) else rejection_sample_reference
        device = self.engine_kwargs["device"]
        return fn if device == "cpu" else (lambda *args: fn(*(t.to(device) for t in args)).cpu())

    @staticmethod
    def _params(requests: list[RequestSpec]) -> list[Any]:
        import dataclasses

        from nanovllm_ref import SamplingParams

        known = {f.name for f in dataclasses.fields(SamplingParams)}
        params = []
        for r in requests:
            unknown = sorted(set(r.params) - known)
            if unknown:
                raise UnsupportedSetting(f"nanovllm_ref's SamplingParams has no {unknown}")
            kwargs = dict(r.params)
            if kwargs.get("structured_outputs") is not None:
                kwargs["structured_outputs"] = _structured_params(kwargs["structured_outputs"])
            params.append(SamplingParams(**kwargs))
        return params

    @staticmethod
    def _completions(o: Any) -> list[Completion]:
        if o.error is not None:
            raise RuntimeError(f"nanovllm_ref request {o.request_id} failed: {o.error}")
        return [Completion(list(c.token_ids), c.finish_reason, c.logprobs, o.prompt_logprobs, o.num_cached_tokens,
                           c.text, c.stop_reason) for c in o.outputs]

    def run_requests(self, requests: list[RequestSpec]) -> list[list[Completion]]:
        """Requests with their own settings, all submitted together (see oracle/requests.py)."""
        outs = self.llm.generate([list(r.prompt) for r in requests], self._params(requests), use_tqdm=False)
        return [self._completions(o) for o in outs]

    def stream_requests(self, requests: list[RequestSpec]) -> list[list[StreamedCompletion]]:
        """The requests added together, then stepped with DELTA outputs (what the server streams); each sample's
        new text in a step's output is one piece, and the outputs joined (``RequestOutput.add``) its completion."""
        import dataclasses

        from nanovllm_ref.outputs import RequestOutput
        from nanovllm_ref.sampling_params import RequestOutputKind

        params = [dataclasses.replace(p, output_kind=RequestOutputKind.DELTA) for p in self._params(requests)]
        rids = [self.llm.add_request(list(r.prompt), p) for r, p in zip(requests, params)]
        pieces = {rid: [[] for _ in range(p.n)] for rid, p in zip(rids, params)}
        joined = {rid: RequestOutput(rid, list(r.prompt)) for rid, r in zip(rids, requests)}
        while self.llm.has_unfinished():
            for out in self.llm.step():
                for c in out.outputs:
                    if c.text:
                        pieces[out.request_id][c.index].append(c.text)
                joined[out.request_id].add(out, aggregate=True)
        return [[StreamedCompletion(c, p) for c, p in zip(self._completions(joined[rid]), pieces[rid])]
                for rid in rids]

    def abort_requests(self, requests: list[RequestSpec], after_steps: int) -> list[list[Completion] | None]:
        """The requests added together, ``after_steps`` engine steps run, then every unfinished one aborted; each
        request's completions (finished or aborted), None where the abort returned no output (see
        oracle/requests.py). The engine then runs until it is idle."""
        params = self._params(requests)
        rids = [self.llm.add_request(list(r.prompt), p) for r, p in zip(requests, params)]
        done: dict[str, Any] = {}
        for _ in range(after_steps):
            done.update((o.request_id, o) for o in self.llm.step() if o.finished)
        for rid in rids:
            if rid not in done:
                done[rid] = self.llm.abort_request(rid)
        while self.llm.has_unfinished():  # nothing may be left running; what is would end here
            self.llm.step()
        return [None if done[rid] is None else self._completions(done[rid]) for rid in rids]

    @staticmethod
    def prefix_cache_kwargs(block_size: int, num_blocks: int, max_model_len: int) -> dict[str, Any]:
        """Engine kwargs for a prefix cache of ``num_blocks`` usable blocks (the cached-tokens capability:
        conformance/test_prefix_cache.py)."""
        return {"kvcache_block_size": block_size, "num_kvcache_blocks": num_blocks, "max_model_len": max_model_len,
                "enable_prefix_caching": True}

    def observe_schedule(self, callback: Callable[[Any], None] | None) -> None:
        """Call ``callback(ScheduleDecision)`` after every scheduling step (None: stop); see
        oracle/schedule_check.py. Optional for adapters: the conformance workload checks the decisions when
        an adapter has this method."""
        from .schedule_check import nanovllm_ref_decision

        engine = self.llm.engine
        if self._observer is not None:
            engine.remove_observer(self._observer)
            self._observer = None
        if callback is not None:
            self._observer = _DecisionCallback(callback, nanovllm_ref_decision)
            engine.add_observer(self._observer)

    @property
    def num_preemptions(self) -> int:
        return self.llm.engine.stats().num_preemptions

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (optional for adapters): a check that bounds cached tokens by what it sent
        itself needs a cold cache on an engine that earlier tests used."""
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        self.llm.shutdown()


def _structured_params(spec: dict[str, Any]) -> Any:
    """nanovllm_ref's StructuredOutputsParams from a request's ``structured_outputs`` dict (oracle/requests.py)."""
    try:
        from nanovllm_ref.sampling_params import StructuredOutputsParams
    except ImportError:
        raise UnsupportedSetting("nanovllm_ref's sampling_params has no StructuredOutputsParams") from None
    try:
        return StructuredOutputsParams(**spec)
    except TypeError as e:  # a key this version's StructuredOutputsParams lacks
        raise UnsupportedSetting(f"nanovllm_ref's StructuredOutputsParams: {e}") from None


class HFAdapter:
    """Hugging Face transformers, the reference arithmetic: ``attn_implementation="eager"``, one prompt at a
    time without padding, a manual greedy loop over the KV cache (EOS never stops it), logprobs =
    ``log_softmax(logits.float())``, greedy and top-k ties broken by the lowest token id. Another
    ``attn_implementation`` (e.g. "sdpa") gives a second correct computation, to measure float noise.
    ``quantization=False`` loads the weights as they are stored, ignoring config.json's ``quantization_config``
    (the fp8-kv reference: its checkpoints declare a KV cache scheme for the engines, oracle/fp8_kv.py)."""

    name = "hf"

    def __init__(
        self, model_path: str, dtype: str = "float32", device: str = "cpu", attn_implementation: str = "eager",
        quantization: bool = True,
    ) -> None:
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM

        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
        dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
        extra = {}
        if not quantization:
            config = AutoConfig.from_pretrained(model_path)
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            extra["config"] = config
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, attn_implementation=attn_implementation, **{dtype_key: torch_dtype}, **extra
        ).to(device).eval()
        self.device = device
        # transformers >= 5.x renamed `past_key_values` to `cache` (the old name warns, then goes away)
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def generate(
        self, prompts: list[list[int]], max_tokens: int, top_k: int, prompt_logprobs: bool
    ) -> list[EngineOutput]:
        return [self._one(list(p), max_tokens, top_k, prompt_logprobs) for p in prompts]

    def _one(self, prompt: list[int], max_tokens: int, top_k: int, want_prompt: bool) -> EngineOutput:
        import torch

        with torch.inference_mode():
            ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, use_cache=True)
            logprobs = out.logits[0].float().log_softmax(dim=-1)  # (len, vocab)
            prompt_lps = None
            if want_prompt:
                prompt_lps = [None]
                for pos in range(1, len(prompt)):
                    d = _topk_dict(logprobs[pos - 1], top_k)
                    d[prompt[pos]] = float(logprobs[pos - 1, prompt[pos]])
                    prompt_lps.append(d)
            cache, last = _cache_of(out), logprobs[-1]
            tokens, topk = [], []
            for step in range(max_tokens):
                d = _topk_dict(last, top_k)
                tok = next(iter(d))  # the argmax, lowest id on ties
                tokens.append(tok)
                topk.append(d)
                if step + 1 == max_tokens:
                    break
                nxt = torch.tensor([[tok]], dtype=torch.long, device=self.device)
                out = self.model(input_ids=nxt, use_cache=True, **{self._cache_kw: cache})
                cache, last = _cache_of(out), out.logits[0, -1].float().log_softmax(dim=-1)
        return EngineOutput(tokens, topk, prompt_lps)

    def close(self) -> None:
        self.model = None


def _cache_of(out: Any) -> Any:
    cache = out.get("cache")
    return cache if cache is not None else out.get("past_key_values")


def _topk_dict(logprobs: Any, k: int) -> dict[int, float]:
    """``{token: logprob}`` of the k largest, in descending order, ties broken by the lowest id."""
    import torch

    vals, ids = torch.sort(logprobs, descending=True, stable=True)
    return dict(zip(ids[:k].tolist(), vals[:k].tolist()))


def resolve_factory(spec: str) -> Callable[..., EngineAdapter]:
    """The factory for a registered name or a ``"pkg.module:factory"`` string."""
    target = ADAPTERS.get(spec, spec)
    if ":" not in target:
        raise ValueError(f"unknown engine {spec!r}: use one of {sorted(ADAPTERS)} or 'pkg.module:factory'")
    module_name, attr = target.split(":", 1)
    factory = importlib.import_module(module_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    if not callable(factory):
        raise TypeError(f"{target} is not callable")
    return factory


def server_url(spec: str) -> str | None:
    """The URL of an engine spec that names a running server ("PREFIX:URL"), else None: a server serves the one
    checkpoint it was started with, while the other engines load whichever checkpoint a test asks for."""
    prefix, _, url = spec.partition(":")
    return url if prefix in SERVER_ADAPTERS and url.startswith(("http://", "https://")) else None


def load_adapter(spec: str, model: str, dtype: str, **kwargs: Any) -> EngineAdapter:
    """Build the adapter named by ``spec`` ("nanovllm_ref", "hf", a key of :data:`ADAPTERS`, "PREFIX:URL" with
    a key of :data:`SERVER_ADAPTERS`, or "pkg.module:factory") for the checkpoint ``model`` in ``dtype``;
    ``kwargs`` go to the factory."""
    from golden.load import resolve_model

    try:  # a golden checkpoint's name is its folder (the resolver the CLI uses)
        model = resolve_model(model)
    except ValueError:  # not a folder nor a golden name: the factory's to read (a hub id, a server's name)
        pass
    url = server_url(spec)
    if url is not None:
        adapter = resolve_factory(SERVER_ADAPTERS[spec.partition(":")[0]])(url, model, dtype, **kwargs)
    else:
        adapter = resolve_factory(spec)(model, dtype, **kwargs)
    missing = [a for a in ("name", "generate", "close") if not hasattr(adapter, a)]
    if missing:
        raise TypeError(f"engine {spec!r} returned {type(adapter).__name__}, which lacks {missing}")
    return adapter
