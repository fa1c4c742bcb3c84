"""Structured outputs: every constrained output is valid, and the engine's distribution is the masked reference's.

Any engine whose adapter has ``run_requests`` and honours the request setting ``structured_outputs`` (vLLM's keys:
``json``, ``regex``, ``choice``, ``grammar``, ``json_object``; nanovllm_ref/oracle/requests.py) takes part; one that
raises UnsupportedSetting for it has these cases skipped, naming the setting. Float32, on one checkpoint per
tokenizer kind by default (qwen3-tiny: byte-level BPE; mistral-spm-hd32: byte fallback + Metaspace; qwen3-words-hd32:
WordLevel), or each ``--model``. The specs (conformance/structured_specs.py) are the edge cases: the empty schema,
enums, nested objects, arrays with minItems / maxItems, string patterns, unicode strings, bounded integers and
numbers, required and optional properties, ``json_object``, a regex, a choice and a small EBNF grammar; a WordLevel
vocabulary gets specs made of its words. The reference (nanovllm_ref/oracle/grammar_reference.py) is llguidance, an
implementation independent of xgrammar, on the checkpoint's token table; the checkpoint's logits are transformers'
(oracle/sampling_reference.py), fed the engine's own tokens (teacher forcing).

* validity: each spec runs greedy and seeded-sampled (n=2) in one batch; an output that finished on "stop" is
  accepted whole by the reference matcher and validates (json.loads + jsonschema, re.fullmatch, choice membership;
  its text too where the vocabulary spells text), one that ended on "length" is a prefix the matcher accepts;
* greedy distribution (specs whose language is vLLM's exactly): at every step the token is the argmax of the
  reference logits masked by the reference's allowed set (a near-tie within the float32 tolerance passes, the
  suite's tie policy), and its logprob and top-20 are the masked, renormalized distribution's within that tolerance;
* mixed batches: constrained and plain requests together each equal their own output alone (tokens exact, logprobs
  within the invariance tolerance); a seeded n=3 request under a grammar is its samples seeded one by one;
* speculative decoding: the validity and greedy checks again under each of the adapter's ``speculative_configs()``
  (name -> engine kwargs), skipped naming that method where the adapter has none.

The reference's own self-tests: test_structured_reference.py (counted apart from the engine's passes); sampled
distributions: test_structured_sampling.py; over HTTP: test_structured_serving.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from nanovllm_ref.oracle.grammar_reference import GrammarReference, token_table
from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting, supports_requests
from nanovllm_ref.oracle.sampling_reference import ReferenceSampler
from nanovllm_ref.oracle.tolerances import INVARIANCE_TOL, golden_tolerance

from .harness import ModelSpec, require_dtype, selected_models
from .structured_specs import Spec, specs_for, why_invalid
from .test_sampling_steps import step_problems

CAPABILITY = "structured outputs"
DTYPE = "float32"
DEFAULT_MODELS = ("qwen3-tiny", "mistral-spm-hd32", "qwen3-words-hd32")  # byte-level, byte fallback, WordLevel
MAX_TOKENS, TOP, SEED = 48, 20, 4321
PROMPT = "Answer with the value only.\ndef value(self):\n    return"
REPORTED_NEG_INF = -9999.0  # what vLLM's server reports for a -inf logprob


def structured_models(config: pytest.Config) -> list[ModelSpec]:
    models = selected_models(config)
    if config.getoption("--model"):
        return models
    return [m for m in models if m.name in DEFAULT_MODELS]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """structured_model alone, or with spec_name (the specs that fit its vocabulary) or exact_spec (those of them
    whose language is vLLM's exactly)."""
    if "structured_model" not in metafunc.fixturenames:
        return
    models = structured_models(metafunc.config)
    for arg, exact in (("spec_name", False), ("exact_spec", True)):
        if arg in metafunc.fixturenames:
            pairs = [(m, n) for m in models for n in specs_for(token_table(m.path).kind, exact_only=exact)]
            metafunc.parametrize(f"structured_model,{arg}", pairs, ids=[f"{m.name}-{n}" for m, n in pairs],
                                 scope="module")
            return
    metafunc.parametrize("structured_model", models, ids=[m.name for m in models], scope="module")


class Checkpoint:
    """One checkpoint's references: the grammar reference, transformers' logits, a prompt, the float32 tolerance."""

    def __init__(self, model: ModelSpec) -> None:
        from transformers import AutoTokenizer

        self.model, self.grammar = model, GrammarReference(model.path)
        self.sampler = ReferenceSampler(model.path)
        self.prompt = AutoTokenizer.from_pretrained(model.path).encode(PROMPT, add_special_tokens=False)
        self.tol = golden_tolerance(DTYPE, checkpoint=model.name if model.golden else None).tol
        self.specs = specs_for(self.grammar.table.kind)

    def masked_logprobs(self, structured: dict, tokens: list[int], raw_del: bool = False) -> torch.Tensor:
        allowed = self.grammar.allowed(structured, tokens, raw_del)
        logits = self.sampler.logits(tuple(self.prompt) + tuple(tokens))
        return logits.masked_fill(~allowed, float("-inf")).log_softmax(-1)


_CHECKPOINTS: dict[str, Checkpoint] = {}


@pytest.fixture(scope="module")
def checkpoint(structured_model: ModelSpec) -> Checkpoint:
    if structured_model.path not in _CHECKPOINTS:
        _CHECKPOINTS[structured_model.path] = Checkpoint(structured_model)
    return _CHECKPOINTS[structured_model.path]


def call(adapter, requests: list[RequestSpec]) -> list:
    try:
        return adapter.run_requests(requests)
    except UnsupportedSetting as e:
        pytest.skip(f"engine {adapter.name} lacks the setting structured_outputs (oracle/requests.py): {e}")


def greedy(structured: dict | None, **extra) -> dict:
    params = {"temperature": 0.0, "max_tokens": MAX_TOKENS, "logprobs": TOP, **extra}
    return {**params, "structured_outputs": structured} if structured is not None else params


def sampled(structured: dict, seed: int, n: int = 2) -> dict:
    return {"temperature": 1.0, "seed": seed, "n": n, "max_tokens": MAX_TOKENS, "structured_outputs": structured}


def run_specs(adapter, ckpt: Checkpoint) -> dict[str, tuple[list, list]]:
    """spec name -> (greedy completions, sampled completions), every request in one batch."""
    names = list(ckpt.specs)
    requests = [RequestSpec(ckpt.prompt, greedy(ckpt.specs[n].structured)) for n in names]
    requests += [RequestSpec(ckpt.prompt, sampled(ckpt.specs[n].structured, SEED + 10 * i))
                 for i, n in enumerate(names)]
    outs = call(adapter, requests)
    return {n: (outs[i], outs[len(names) + i]) for i, n in enumerate(names)}


_RUNS: dict[tuple, dict] = {}


@pytest.fixture(scope="module")
def structured_engine(structured_model: ModelSpec, engines, pytestconfig):
    require_dtype(pytestconfig, DTYPE)  # (a server runs one dtype: --dtype bfloat16 leaves the bfloat16 cases)
    adapter = engines.get(structured_model, DTYPE)
    if not supports_requests(adapter):
        pytest.skip(f"engine {adapter.name} has no run_requests (oracle/requests.py): structured outputs need it")
    return adapter


def spec_run(adapter, ckpt: Checkpoint, name: str, key: tuple = ()) -> tuple[list, list]:
    run_key = (id(adapter), ckpt.model.path, *key)
    if run_key not in _RUNS:
        _RUNS[run_key] = run_specs(adapter, ckpt)
    return _RUNS[run_key][name]


def with_stop(ckpt: Checkpoint, completion) -> list[int]:
    """The completion's tokens, with the EOS it stopped on where the engine left it out (one EOS id only)."""
    tokens, eos = list(completion.token_ids), ckpt.grammar.table.eos
    if completion.finish_reason == "stop" and (not tokens or tokens[-1] not in eos) and len(eos) == 1:
        tokens.append(eos[0])
    return tokens


def validity_problems(ckpt: Checkpoint, spec: Spec, completion) -> list[str]:
    tokens, table = with_stop(ckpt, completion), ckpt.grammar.table
    walk = ckpt.grammar.walk(spec.structured, tokens, raw_del=True)
    spelled = table.spell(tokens).decode("utf-8", "replace")
    if walk.accepted < len(tokens):
        return [f"token {walk.accepted} ({tokens[walk.accepted]}) is refused by the grammar after {spelled!r}"]
    if completion.finish_reason == "length":
        return []
    if completion.finish_reason != "stop":
        return [f"finish_reason {completion.finish_reason!r}"]
    bad = [] if walk.accepting else [f"stopped where the grammar does not accept: {spelled!r}"]
    why = why_invalid(spec.structured, spelled)
    bad += [f"{spelled!r} {why}"] if why else []
    if completion.text is not None and table.kind != "raw" and table.spell(tokens) == spelled.encode():
        why = why_invalid(spec.structured, completion.text)
        bad += [f"the engine's text {completion.text!r} {why}"] if why else []
    return bad


def test_outputs_are_valid(spec_name, structured_engine, checkpoint) -> None:
    name, spec = spec_name, checkpoint.specs[spec_name]
    runs = spec_run(structured_engine, checkpoint, name)
    completions = [c for group in runs for c in group]
    assert len(completions) == 3, f"{name}: asked 1 greedy + 2 sampled completions, got {len(completions)}"
    bad = [f"  {kind} {list(c.token_ids)}: {p}" for kind, c in zip(("greedy", "sample 0", "sample 1"), completions)
           for p in validity_problems(checkpoint, spec, c)]
    assert not bad, f"{checkpoint.model.name} {name} {spec.structured}:\n" + "\n".join(bad)


def reported(step: dict[int, float]) -> dict[int, float]:
    return {t: float("-inf") if v is None or v <= REPORTED_NEG_INF else v for t, v in step.items()}


def distribution_problems(ckpt: Checkpoint, spec: Spec, completion, tol: float | None = None) -> list[str]:
    """Every step of a greedy completion against the masked reference fed its tokens, within ``tol`` (default the
    float32 tolerance); at each step either DEL convention may hold (grammar_reference.py: raw DEL in a JSON string)."""
    tol = ckpt.tol if tol is None else tol
    tokens = with_stop(ckpt, completion)
    logprobs = completion.logprobs
    if logprobs is not None and len(logprobs) not in (len(tokens), len(completion.token_ids)):
        return [f"{len(logprobs)} logprobs dicts for {len(tokens)} tokens"]
    bad = []
    for j, drawn in enumerate(tokens):
        got = reported(logprobs[j]) if logprobs is not None and j < len(logprobs) else None
        problems = [step_check(ckpt.masked_logprobs(spec.structured, tokens[:j], raw_del), drawn, got, tol)
                    for raw_del in (False, True)]
        if all(problems):
            bad += [f"step {j} (after {ckpt.grammar.table.spell(tokens[:j])[-40:]!r}): {p}" for p in problems[0]]
        if any("does not allow" in p for p in problems[0]):
            break
    return bad


def step_check(want: torch.Tensor, drawn: int, got: dict[int, float] | None, tol: float) -> list[str]:
    """One step: the drawn token allowed and the masked argmax (within ``tol``), the reported values ``want``'s."""
    if not math.isfinite(float(want[drawn])):
        return [f"drew {drawn}, which the grammar does not allow there"]
    bad = []
    if float(want[drawn]) < float(want.max()) - tol:
        bad.append(f"drew {drawn} ({float(want[drawn]):.5f}), the masked argmax is {int(want.argmax())} "
                   f"({float(want.max()):.5f})")
    return bad + (step_problems(got, want, drawn, tol) if got is not None else [])


def test_greedy_follows_the_masked_reference(exact_spec, structured_engine, checkpoint) -> None:
    name, spec = exact_spec, checkpoint.specs[exact_spec]
    completion = spec_run(structured_engine, checkpoint, name)[0][0]
    bad = distribution_problems(checkpoint, spec, completion)
    assert not bad, (f"{checkpoint.model.name} {name}, tokens {list(completion.token_ids)} (tolerance "
                     f"{checkpoint.tol:.0e}):\n  " + "\n  ".join(bad[:10]))


def _same(a, b) -> str | None:
    if list(a.token_ids) != list(b.token_ids):
        return f"tokens {list(a.token_ids)} vs alone {list(b.token_ids)}"
    for j, (x, y) in enumerate(zip(a.logprobs or [], b.logprobs or [])):
        off = {t: (v, y[t]) for t, v in x.items() if t in y and not (v == y[t] or abs(v - y[t]) <= INVARIANCE_TOL)}
        if off:
            return f"step {j}: logprobs (batched, alone) {dict(list(off.items())[:3])}"
    return None


def test_mixed_batch_equals_alone(structured_engine, checkpoint) -> None:
    """Plain and constrained greedy requests in one batch (specs of different kinds side by side) each equal the same
    request alone."""
    names = [n for n in checkpoint.specs if checkpoint.specs[n].exact][:4]
    plain = [RequestSpec(checkpoint.prompt[: 4 + 3 * i], greedy(None, max_tokens=12, ignore_eos=True))
             for i in range(3)]
    constrained = [RequestSpec(checkpoint.prompt, greedy(checkpoint.specs[n].structured)) for n in names]
    batch = [constrained[0], plain[0], constrained[1], plain[1], constrained[2], plain[2], *constrained[3:]]
    together = call(structured_engine, batch)
    bad = []
    for r, got in zip(batch, together):
        alone = call(structured_engine, [r])[0][0]
        problem = _same(got[0], alone)
        label = r.params.get("structured_outputs", "plain")
        bad += [f"  {label}: {problem}"] if problem else []
    assert not bad, f"{checkpoint.model.name}: batched requests differ from alone:\n" + "\n".join(bad)


def test_n_samples_under_a_grammar(structured_engine, checkpoint) -> None:
    """A seeded n=3 request under a grammar: sample i is the request seeded seed + i alone (vLLM's convention), each
    valid."""
    name = next(n for n in ("regex", "words-regex") if n in checkpoint.specs)
    spec = checkpoint.specs[name]
    group = call(structured_engine, [RequestSpec(checkpoint.prompt, sampled(spec.structured, SEED, n=3))])[0]
    alone = call(structured_engine, [RequestSpec(checkpoint.prompt, sampled(spec.structured, SEED + i, n=1))
                                     for i in range(3)])
    assert [list(c.token_ids) for c in group] == [list(a[0].token_ids) for a in alone]
    bad = [p for c in group for p in validity_problems(checkpoint, spec, c)]
    assert not bad, "\n".join(bad)


def test_structured_under_speculative_decoding(structured_model, engines, checkpoint, pytestconfig) -> None:
    """The validity and greedy checks under each speculative config the adapter advertises
    (``speculative_configs(model_path)``) and --speculative-config's, as test_spec_decode.py takes them."""
    from nanovllm_ref.oracle.spec_decode import ENABLED_BY, configs_for

    from .harness import adapter_factory

    require_dtype(pytestconfig, DTYPE)
    engine = pytestconfig.getoption("--engine")
    configs = [c for c in configs_for(adapter_factory(engine), structured_model,
                                      pytestconfig.getoption("--speculative-config")) if c.name is not None]
    if not configs:
        pytest.skip(f"engine {engine} advertises no speculative config: structured outputs under speculative "
                    f"decoding not checked (needs {ENABLED_BY})")
    bad = []
    for config in configs:
        name, spec_adapter = config.name, engines.get(structured_model, DTYPE, **config.settings)
        for spec_name, spec in checkpoint.specs.items():
            greedy_c, samples = spec_run(spec_adapter, checkpoint, spec_name, key=("speculative", name))
            for c in [*greedy_c, *samples]:
                bad += [f"  {name} {spec_name}: {p}" for p in validity_problems(checkpoint, spec, c)]
            if spec.exact:
                bad += [f"  {name} {spec_name}: {p}" for p in distribution_problems(checkpoint, spec, greedy_c[0])]
    assert not bad, f"{structured_model.name} under speculative decoding:\n" + "\n".join(bad[:20])


def test_bfloat16_outputs(structured_model, engines, checkpoint, pytestconfig) -> None:
    """The engine in bfloat16: every spec's outputs valid, and each exact spec's greedy steps the masked float32
    reference's within the bfloat16 golden tolerance (its per-token bound; the masked argmax within it)."""
    require_dtype(pytestconfig, "bfloat16")
    adapter = engines.get(structured_model, "bfloat16")
    if not supports_requests(adapter):
        pytest.skip(f"engine {adapter.name} has no run_requests (oracle/requests.py): structured outputs need it")
    tol = golden_tolerance("bfloat16", checkpoint=structured_model.name if structured_model.golden else None).tol
    bad = []
    for name, spec in checkpoint.specs.items():
        greedy_c, samples = spec_run(adapter, checkpoint, name, key=("bfloat16",))
        for kind, c in zip(("greedy", "sample 0", "sample 1"), [*greedy_c, *samples]):
            bad += [f"  {name} {kind} {list(c.token_ids)}: {p}" for p in validity_problems(checkpoint, spec, c)]
        if spec.exact:
            bad += [f"  {name} greedy: {p}" for p in distribution_problems(checkpoint, spec, greedy_c[0], tol)[:3]]
    assert not bad, f"{structured_model.name} in bfloat16 (tolerance {tol:.3f}):\n" + "\n".join(bad[:20])
