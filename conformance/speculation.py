"""What test_spec_decode.py and test_spec_decode_sampling.py share: the engine of a speculative config, a run's
spec-decode counts and the checks that speculation happened, and the comparison of a greedy completion with the
same engine's without speculation (oracle/spec_decode.py has the adapter side)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import pytest

from nanovllm_ref.oracle.requests import Completion, RequestSpec, UnsupportedSetting, supports_requests
from nanovllm_ref.oracle.spec_decode import ENABLED_BY, SpecConfig, SpecCounts, read_counts, speculation_meta

DTYPE = "float32"  # the request-level cases' dtype whatever --dtype says (as test_sampling.py)
MIN_SELF_ACCEPTANCE = 0.98  # a draft model that is the target accepts its drafts (p = q up to float rounding)


def spec_engine(engines: Any, spec: SpecConfig, dtype: str = DTYPE, requests: bool = False, **extra: Any) -> Any:
    """The pool's engine with the config's settings (and ``extra``); skips where the engine advertises no config,
    or, with ``requests``, has no run_requests."""
    if spec.name is None:
        pytest.skip(f"engine {engines.options.engine} advertises no speculative config: needs {ENABLED_BY}")
    adapter = engines.get(spec.model, dtype, **spec.settings, **extra)
    if requests and not supports_requests(adapter):
        pytest.skip(f"engine {adapter.name} has no run_requests (oracle/requests.py): this case needs it")
    return adapter


def plain_engine(engines: Any, spec: SpecConfig, **extra: Any) -> Any:
    """The same engine without speculation (the baseline of the stop, cache and preemption cases)."""
    adapter = engines.get(spec.model, DTYPE, **extra)
    if not supports_requests(adapter):
        pytest.skip(f"engine {adapter.name} has no run_requests (oracle/requests.py): this case needs it")
    url = getattr(adapter, "base_url", None)  # a server: speculation is its launch setting, not the client's
    if url is not None and url == getattr(engines.get(spec.model, DTYPE, **spec.settings), "base_url", None):
        pytest.skip(f"the server at {url} speculates for every request: this case compares with the same checkpoint "
                    "served without speculation (--engine-arg plain_url=URL of that server)")
    return adapter


def run(adapter: Any, requests: list[RequestSpec]) -> list[list[Completion]]:
    try:
        return adapter.run_requests(requests)
    except UnsupportedSetting as e:
        pytest.skip(f"engine lacks a setting: {e}")


class Counted:
    """The spec-decode counts an adapter reports over a block of calls (None where it reports none)."""

    counts: SpecCounts | None = None


@contextmanager
def counted(adapter: Any):
    before, out = read_counts(adapter), Counted()
    yield out
    after = read_counts(adapter)
    out.counts = None if before is None or after is None else after - before


def predicted(tokens: list[int], i: int, low: int = 1, high: int = 3) -> bool:
    """Whether prompt lookup proposes tokens[i] there under either usual rule (the longest suffix of tokens[:i] of
    length in [low, high] that occurred before; its latest and its earliest occurrence both propose it)."""
    for n in range(min(high, i - 1), low - 1, -1):
        suffix = tokens[i - n : i]
        starts = [s for s in range(i - n) if tokens[s : s + n] == suffix]
        if starts:
            return tokens[starts[-1] + n] == tokens[i] == tokens[starts[0] + n]
    return False


def speculation_problems(counts: SpecCounts | None, spec: SpecConfig, what: str, self_acceptance: bool = False,
                         runs: list[tuple[list[int], list[int]]] | None = None) -> list[str]:
    """Why a run that must have speculated did not (no draft proposed, none accepted), and, with
    ``self_acceptance`` for a draft model that is the target, an acceptance rate under MIN_SELF_ACCEPTANCE. An
    adapter that reports no counts passes (nothing to check there; the summary says so). With ``runs`` (prompt,
    emitted tokens) of a short case, none accepted is a problem only where a draft had to be: prompt lookup
    predicting a token the run emitted (its draft equals the emitted token, which the rejection rule emits only
    by accepting it), or a draft model that is the target; a smaller draft may be refused every time."""
    if counts is None:
        return []
    if runs is not None and counts.num_accepted_tokens <= 0 and not spec.draft_is_target:
        if spec.speculative.get("method") != "ngram":
            return []
        hit = next(((r, j) for r, (prompt, out) in enumerate(runs) for j in range(len(out))
                    if predicted(prompt + out, len(prompt) + j)), None)
        if hit is None:
            return []  # prompt lookup predicted none of the emitted tokens: no draft could have been accepted
        return [f"{what}: no draft accepted ({counts}), yet prompt lookup proposes token {hit[1]} of run {hit[0]} "
                f"({runs[hit[0]][1][hit[1]]}), which the run emitted"]
    if counts.num_draft_tokens <= 0:
        return [f"{what}: no draft token was proposed ({counts}): nothing was speculated"]
    problems = []
    if counts.num_accepted_tokens <= 0:
        problems.append(f"{what}: none of {counts.num_draft_tokens} draft tokens was accepted: no accepted run checked")
    if self_acceptance and spec.draft_is_target and counts.acceptance_rate < MIN_SELF_ACCEPTANCE:
        problems.append(f"{what}: the draft model is the target itself, yet only {counts.num_accepted_tokens} of "
                        f"{counts.num_draft_tokens} drafts were accepted ({counts.acceptance_rate:.3f} < "
                        f"{MIN_SELF_ACCEPTANCE})")
    return problems


def record_run(record_spec: Any, spec: SpecConfig, case: str, counts: SpecCounts | None,
               dtype: str = DTYPE) -> None:
    record_spec(speculation_meta(spec, dtype, case, counts))


def float32_tol(spec: SpecConfig) -> float:
    from nanovllm_ref.oracle.tolerances import golden_tolerance

    return golden_tolerance(DTYPE, checkpoint=spec.model.name if spec.model.golden else None).tol


def first_difference(got: Completion, want: Completion, tol: float) -> str | None:
    """Where a greedy completion with speculation leaves the same engine's without it (tokens, text, finish), None
    where it does not. A first differing token the run without speculation ranks within ``tol`` of its own (a near
    tie: verify rows' arithmetic may round differently) ends the comparison there."""
    a, b = list(got.token_ids), list(want.token_ids)
    j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if j is not None:
        lp = want.logprobs[j] if want.logprobs and j < len(want.logprobs) else {}
        if a[j] in lp and b[j] in lp and lp[b[j]] - lp[a[j]] <= tol:
            return None
        return f"token {j}: {a[j]}, without speculation {b[j]} (tokens {a} vs {b})"
    if len(a) != len(b):
        return f"{len(a)} tokens, without speculation {len(b)}: {a} vs {b}"
    if (got.text, got.finish_reason, got.stop_reason) != (want.text, want.finish_reason, want.stop_reason):
        return (f"text {got.text!r} ({got.finish_reason}, stop_reason {got.stop_reason!r}), without speculation "
                f"{want.text!r} ({want.finish_reason}, {want.stop_reason!r})")
    if got.logprobs is not None and len(got.logprobs) != len(a):
        return f"{len(got.logprobs)} logprobs entries for {len(a)} tokens"
    return None
