"""A mixed workload, compared request by request with the golden (or live) reference, float32.

Every request has its own settings (``run_requests``, nanovllm_ref/oracle/requests.py; adapters without it are
skipped with the reason). What each request must return is derived from the reference's greedy tokens: the
tokens up to the first one in the request's stop set (its ``stop_token_ids``, plus the checkpoint's EOS ids
unless ``ignore_eos``) or up to ``max_tokens``, with finish reason ``"stop"`` / ``"length"``; its top-n
logprob dicts (n = the request's own ``logprobs``) and prompt logprobs agree in VALUE with the reference's
top-20 within the dtype tolerance, so a rescale that keeps every argmax is caught too.

To make EOS reachable, the checkpoint is served from a copy whose ``generation_config.json`` adds one EOS id
that the reference generates mid-way (``config.json`` keeps the original). One batch mixes stop tokens, EOS
honoured and ignored, logprobs counts 0 / 1 / 5 / 20 / none, prompt logprobs on prompts that share prefixes
with cache-using requests (asked twice), and a request whose ``max_tokens`` reaches ``max_model_len`` exactly.
For nanovllm_ref the engine runs it with a KV cache small enough that prefix hits meet a full cache and
preemption (asserted), and prefill chunk budgets of block_size - 1, block_size and block_size + 1 tokens; other
engines get the same requests with their own defaults. The chunk-budget case also runs requests without logprobs
(steps an engine may schedule ahead of the one in flight), one ending on its prefill's own sample (max_tokens=1),
and a seeded sample alone and next to the others (the same tokens: a request's draws never depend on the batch).
When the adapter has ``observe_schedule``, every
scheduling step is checked against the invariants of nanovllm_ref/oracle/schedule_check.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanovllm_ref.oracle.adapters import server_url
from nanovllm_ref.oracle.compare import DIVERGED_OK, EngineOutput, compare_outputs
from nanovllm_ref.oracle.derived import link_checkpoint
from nanovllm_ref.oracle.references import Reference
from nanovllm_ref.oracle.requests import RequestSpec, UnsupportedSetting, supports_requests
from nanovllm_ref.oracle.schedule_check import check_decision
from nanovllm_ref.oracle.text_reference import checkpoint_eos

from .harness import ModelSpec, tolerance_for

DTYPE = "float32"
BLOCK = 16  # nanovllm_ref's KV block size here; the chunk budgets straddle it
LONG = "long_300"
LENGTH_CAP = 20  # the long prompt's max_tokens: prompt + LENGTH_CAP = max_model_len
SHARED = ("shared48_prefix", "shared48_a", "shared48_b", "shared48_c", "prefix_of_next", "extends_prev")


def first_new(tokens: list[int], k: int) -> int:
    """The first step >= k whose token has not occurred before it (so a stop on it ends exactly there)."""
    return next(i for i in range(k, len(tokens)) if tokens[i] not in tokens[:i])


def with_extra_eos(src: str, dst: Path, eos: int) -> str:
    """A copy of checkpoint ``src`` (files linked) whose generation_config.json also lists ``eos``."""
    link_checkpoint(src, dst, replaced=("generation_config.json",))
    gen_file = Path(src) / "generation_config.json"
    gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    gen["eos_token_id"] = sorted(checkpoint_eos(src) | {eos})
    (dst / "generation_config.json").write_text(json.dumps(gen))
    return str(dst)


def expected(ref: EngineOutput, prompt_len: int, params: dict, eos: set[int], max_model_len: int | None):
    """(tokens, finish_reason) the request must produce, from the reference's greedy tokens."""
    stops = set(params.get("stop_token_ids", ())) | (set() if params.get("ignore_eos") else eos)
    limit = params["max_tokens"] if max_model_len is None else min(params["max_tokens"], max_model_len - prompt_len)
    for i, tok in enumerate(ref.token_ids[:limit]):
        if tok in stops:
            return ref.token_ids[: i + 1], "stop"
    return ref.token_ids[:limit], "length"


class Workload:
    """Requests by prompt name, checked against the reference; collects the failures."""

    def __init__(self, ref: Reference, eos: set[int], tol, max_model_len: int | None, cold: bool = True) -> None:
        self.ref, self.eos, self.tol, self.max_model_len = ref, eos, tol, max_model_len
        self.cold = cold  # the engine's prefix cache held nothing when the workload began
        self.index = {name: i for i, name in enumerate(ref.prompt_ids)}
        self.failures: list[str] = []
        self.seen: list[list[int]] = []  # prompt + reference tokens of every request run so far on the engine

    def spec(self, name: str, **params) -> tuple[str, RequestSpec]:
        params.setdefault("temperature", 0.0)
        return name, RequestSpec(list(self.ref.prompts[self.index[name]]), params)

    def run(self, adapter, named: list[tuple[str, RequestSpec]], label: str) -> list:
        try:
            results = adapter.run_requests([r for _, r in named])
        except UnsupportedSetting as e:
            pytest.skip(f"{adapter.name}: {e}")
        assert len(results) == len(named), f"{label}: {len(named)} requests, {len(results)} results"
        full = [list(r.prompt) + self.ref.outputs[self.index[n]].token_ids for n, r in named]
        for j, ((name, req), comps) in enumerate(zip(named, results)):
            self.check(f"{label}/{name}", name, req, comps[0])
            self.check_cached(f"{label}/{name}", req.prompt, comps[0], self.seen + full[:j] + full[j + 1:])
        self.seen += full
        return [c[0] for c in results]

    def check_cached(self, label: str, prompt: list[int], c, others: list[list[int]]) -> None:
        """A prefix cache can only serve tokens that another request computed: the shared prefix bounds it."""
        # an engine that earlier tests used (a server, say) and that cannot empty its cache may serve blocks
        # they computed: then only the prompt bounds it
        bound = max((_common_prefix(prompt, o) for o in others), default=0) if self.cold else len(prompt) - 1
        if c.num_cached_tokens is not None and not 0 <= c.num_cached_tokens <= min(bound, len(prompt) - 1):
            self.failures.append(f"[{label}] num_cached_tokens {c.num_cached_tokens}, but at most {bound} of its "
                                 f"{len(prompt)} prompt tokens were ever computed by another request")

    def check(self, label: str, name: str, req: RequestSpec, c) -> None:
        i, p = self.index[name], req.params
        ref = self.ref.outputs[i]
        tokens, reason = expected(ref, len(req.prompt), p, self.eos, self.max_model_len)
        n, m = p.get("logprobs"), p.get("prompt_logprobs")
        fail = self.failures.append
        topk = c.logprobs if n is not None else [ref.topk[j] for j in range(len(c.token_ids))]
        cand = EngineOutput(list(c.token_ids), list(topk or []), c.prompt_logprobs)
        want = EngineOutput(tokens, ref.topk[: len(tokens)], ref.prompt_logprobs if m is not None else None)
        rep = compare_outputs(want, cand, top_k=max(n or 1, 1), tol=self.tol.tol,
                              prompt_tol=self.tol.prompt_tol if m is not None else None, prompt=req.prompt,
                              prompt_id=label)
        if not rep.passed:
            fail(rep.message)
        elif rep.status == DIVERGED_OK:  # a near-tie flipped: the rest is another (valid) generation
            return
        elif c.finish_reason != reason:
            fail(f"[{label}] finish_reason {c.finish_reason!r}, expected {reason!r} after {len(tokens)} tokens")
        if n is not None:
            for step, d in enumerate(c.logprobs or []):
                top = sorted(d, key=lambda t: -d[t])
                if not (n <= len(d) <= n + 1) or (len(d) == n + 1 and top[n] != c.token_ids[step]):
                    fail(f"[{label}] gen step {step}: {len(d)} logprobs for logprobs={n} (top-n + the chosen token)")
                    break
        elif c.logprobs:
            fail(f"[{label}] logprobs returned although not asked for")
        if m is not None and c.prompt_logprobs is not None:
            for pos, d in enumerate(c.prompt_logprobs[1:], start=1):
                if d is None or not (m <= len(d) <= m + 1):
                    fail(f"[{label}] prompt pos {pos}: {d and len(d)} logprobs for prompt_logprobs={m}")
                    break


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _observer(adapter, failures: list[str]):
    """Check each scheduling step, if the engine reports them; returns a counter of checked steps."""
    steps = [0]
    hook = getattr(adapter, "observe_schedule", None)
    if hook is None:
        return None

    def on_decision(decision) -> None:
        steps[0] += 1
        failures.extend(check_decision(decision)[:3])

    hook(on_decision)
    return steps


@pytest.fixture(scope="module")
def setup(model_spec, options, references, tmp_path_factory):
    ref = references.get(model_spec, DTYPE)
    names = set(ref.prompt_ids)
    if not {LONG, "short_12", "block_33", *SHARED} <= names:
        pytest.skip("the workload needs the golden prompt set")
    k = first_new(ref.outputs[ref.prompt_ids.index("short_12")].token_ids, 6)
    extra = ref.outputs[ref.prompt_ids.index("short_12")].token_ids[k]
    eos = checkpoint_eos(model_spec.path)
    path = model_spec.path
    if server_url(options.engine) is None:  # a server serves its own checkpoint: keep its EOS
        path = with_extra_eos(model_spec.path, tmp_path_factory.mktemp(f"{model_spec.name}-eos"), extra)
        eos = eos | {extra}
    return ref, ModelSpec(model_spec.name, path, model_spec.golden), eos


def _adapter(engines, options, spec: ModelSpec, **nanovllm_ref_kwargs):
    """The engine, its prefix cache emptied where the adapter can (`reset_prefix_cache`); `.cold` says whether it
    is known to hold nothing from earlier tests."""
    kwargs = nanovllm_ref_kwargs if options.engine == "nanovllm_ref" else {}
    adapter = engines.get(spec, DTYPE, **kwargs)
    if not supports_requests(adapter):
        pytest.skip(f"engine {options.engine} has no run_requests (nanovllm_ref/oracle/requests.py)")
    reset = getattr(adapter, "reset_prefix_cache", None)
    if callable(reset):
        reset()
    return adapter, callable(reset)


def test_mixed_workload(setup, options, engines) -> None:
    ref, spec, eos = setup
    ours = options.engine == "nanovllm_ref"
    max_model_len = len(ref.prompts[ref.prompt_ids.index(LONG)]) + LENGTH_CAP
    # one request of max_model_len + 2 blocks: prefix hits meet a full cache, admissions fail for want of
    # blocks, requests are preempted
    adapter, cold = _adapter(engines, options, spec, kvcache_block_size=BLOCK,
                             num_kvcache_blocks=-(-max_model_len // BLOCK) + 2, max_model_len=max_model_len,
                             max_num_batched_tokens=BLOCK + 1, enable_prefix_caching=True)
    w = Workload(ref, eos, tolerance_for(DTYPE, options, ref), max_model_len if ours else None, cold)
    steps = _observer(adapter, w.failures)
    tokens_of = {n: ref.outputs[i].token_ids for i, n in enumerate(ref.prompt_ids)}
    mixed = [
        w.spec("short_12", max_tokens=32, logprobs=0),  # stops on the extra EOS
        w.spec("short_12", max_tokens=32, ignore_eos=True, logprobs=20),  # must run past it
        w.spec("short_8", max_tokens=32, ignore_eos=True, logprobs=1,
               stop_token_ids=[tokens_of["short_8"][first_new(tokens_of["short_8"], 4)]]),
        w.spec("block_33", max_tokens=24, logprobs=5,
               stop_token_ids=[tokens_of["block_33"][first_new(tokens_of["block_33"], 0)]]),  # stops at once
        w.spec("block_17", max_tokens=9, logprobs=None),
        w.spec(LONG, max_tokens=LENGTH_CAP, ignore_eos=True, logprobs=3),  # prompt + max_tokens = max_model_len
        w.spec("long_130", max_tokens=12, ignore_eos=True, logprobs=2, prompt_logprobs=4),
    ]
    shared = [w.spec(n, max_tokens=6, ignore_eos=True, logprobs=2 + j % 3,
                     **({"prompt_logprobs": 5} if j % 2 else {})) for j, n in enumerate(SHARED)]
    w.run(adapter, mixed + shared, "mixed")
    again = w.run(adapter, [w.spec(n, max_tokens=4, ignore_eos=True, logprobs=1,
                                   **({} if j % 2 else {"prompt_logprobs": 2})) for j, n in enumerate(SHARED)]
                  + shared[::-1], "again")
    if ours:
        assert adapter.num_preemptions > 0, "the small KV cache should have forced preemptions"
        assert any((c.num_cached_tokens or 0) > 0 for c in again), "the repeated prompts should hit the cache"
        assert steps and steps[0] > 0
    assert not w.failures, "\n".join(w.failures[:20])


@pytest.mark.parametrize("budget", [BLOCK - 1, BLOCK, BLOCK + 1], ids=lambda b: f"budget{b}")
def test_chunk_budgets(setup, options, engines, budget) -> None:
    """Prefills cut by a token budget at and around a block boundary, with prompt logprobs and prefix hits."""
    if options.engine != "nanovllm_ref" and budget != BLOCK:
        pytest.skip("the chunk budget is a nanovllm_ref setting: other engines run this once, with their defaults")
    ref, spec, eos = setup
    adapter, cold = _adapter(engines, options, spec, kvcache_block_size=BLOCK, max_num_batched_tokens=budget,
                             max_model_len=512)
    w = Workload(ref, eos, tolerance_for(DTYPE, options, ref), None, cold)
    steps = _observer(adapter, w.failures)
    names = ("block_15", "block_16", "block_17", "block_31", "block_32", "block_33", "long_70", "shared48_a",
             "shared48_b")
    w.run(adapter, [w.spec(n, max_tokens=3, ignore_eos=True, logprobs=j % 4, prompt_logprobs=3 if j % 2 else None)
                    for j, n in enumerate(names)], f"budget-{budget}")
    # again, all cached, without logprobs (steps an engine may schedule ahead), rows ending at different steps,
    # one on a stop token, one on its prefill's own sample (max_tokens=1)
    tokens = ref.outputs[ref.prompt_ids.index("long_70")].token_ids
    again = [w.spec(n, max_tokens=3 + 2 * (j % 3), ignore_eos=True) for j, n in enumerate(names[::-1])]
    # its stop comes after long_130's 130-token prefill is done (~9 chunks), so it ends in a steady decode step (a
    # vectorized path of its own in nanovllm_ref); a reference that repeats itself from there stops it earlier
    late = [i for i in range(12, min(len(tokens), 20)) if tokens[i] not in tokens[:i]]
    again.append(w.spec("long_70", max_tokens=20, stop_token_ids=[tokens[late[0] if late else first_new(tokens, 4)]]))
    again.append(w.spec("long_130", max_tokens=1, ignore_eos=True))
    w.run(adapter, again, f"budget-{budget}-again")
    # a seeded sample draws the same tokens alone and next to other requests' prefill chunks and decodes
    seeded = RequestSpec(list(ref.prompts[w.index["block_31"]]), {"temperature": 1.0, "seed": 1234, "max_tokens": 8,
                                                                  "ignore_eos": True})
    try:
        alone = adapter.run_requests([seeded])[0][0].token_ids
        batch = adapter.run_requests([r for _, r in again[:3]] + [seeded] + [r for _, r in again[3:]])
    except UnsupportedSetting as e:
        assert not w.failures, "\n".join(w.failures[:20])
        pytest.skip(f"{adapter.name}: the seeded case needs {e}")
    if batch[3][0].token_ids != alone:
        w.failures.append(f"[budget-{budget}-seeded] a seeded sample drew {batch[3][0].token_ids} in a batch, "
                          f"{alone} alone")
    if options.engine == "nanovllm_ref":
        assert steps and steps[0] > 0
    assert not w.failures, "\n".join(w.failures[:20])
