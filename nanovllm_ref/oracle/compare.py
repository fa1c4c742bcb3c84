"""Compare greedy generations (tokens, top-k logprobs, prompt logprobs) of a candidate engine to a reference.

The policy is vLLM's ``check_logprobs_close`` (vllm ``tests/models/utils.py``) made stricter with value checks
in the spirit of SGLang's ``check_close_model_outputs`` (``sglang/test/runners.py``, which bounds
``|hf_logprobs - srt_logprobs|`` of the top-k by ``prefill_tolerance`` / ``decode_tolerance``, 5e-2 by default):

* Generated tokens must be equal. At the first position where they differ, each side's token must be in
  the other side's top-k (the two distributions were nearly tied there), and the comparison of that prompt
  stops: after it the contexts differ. That is a pass with a recorded divergence (``diverged-ok``), as in
  vLLM; ``allow_divergence=False`` (used for engine-vs-engine invariance checks) makes it a failure.
* Stricter than vLLM: at every compared position (matched steps and the divergence step, whose context is
  still identical) the logprobs of the tokens present in both sides' dicts must agree within ``tol``, and a
  token in one side's top-k that is missing from the other's full top-k must not be provably further than
  ``tol`` away (absent means its logprob is at most the other side's k-th value).
* Prompt logprobs (teacher forced, no divergence possible) must agree the same way within ``prompt_tol``,
  and (given the prompts) every position's dict must hold the actual prompt token, as vLLM's do.
* Over a whole golden set (``compare_all`` with ``mean_tol``), the mean |dlogprob| of all those generated-step
  logprobs must stay within ``mean_tol``: a systematic error (a dropped bias) that the per-position bound, made
  wide for rare routing near-ties, lets through still moves the mean (tolerances.py). A set-level failure.
* Position-dependent bounds (``position_tol``, ``((end, bound), ...)`` in increasing ``end``): at a token whose index
  in the sequence (prompt position, or prompt length + generated step) is below ``end`` and at or above the previous
  ``end``, the bound is ``max(tol, bound)`` (``prompt_tol`` likewise): float32 RoPE angle rounding grows with the
  position (tolerances.py, rope_spread.py). Beyond the last ``end``, and without it, ``tol`` alone.
* A candidate that stops early or lacks the (prompt) logprobs the reference has fails.
* Divergence by value (``divergence_by_value=True``, the quantization tiers of tolerances.py): at the first
  differing token, a token absent from the other side's top-k is admitted when its logprob exceeds that side's k-th
  value by at most ``tol`` (the value bound could still hold); the rule above asks for top-k membership, which is
  right for float noise but stricter than the bounds of a tier whose per-position bound spans several nats.
* Tokens-only mode (``tokens_only=True``), for engines that return no logprobs (nano-vllm's API, servers
  without logprobs): tokens must be equal, and at the first divergence the candidate's token must be in the
  reference's top-k (the only side with a top-k); no values are compared. Reports say ``mode: tokens-only``.

Example::

    report = compare_all(golden_outputs, engine_outputs, top_k=20, tol=1e-3, prompt_tol=1e-3,
                         prompt_ids=names, model="qwen3-tiny", dtype="float32", engine="nanovllm_ref")
    assert report.passed, report.format_failures()
    for line in summary_lines(report):  # report.py: the end-of-run summary text
        print(line)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .report import DIVERGED_OK, FAIL, MATCH, TOKENS_ONLY, ConformanceReport, PromptReport

__all__ = [
    "DIVERGED_OK", "FAIL", "MATCH", "TOKENS_ONLY", "ConformanceReport", "EngineOutput", "PromptReport", "compare_all",
    "compare_outputs", "describe_token",
]
LogprobDict = dict[int, float]


@dataclass
class EngineOutput:
    """One greedy generation as the comparison sees it.

    Attributes:
        token_ids: generated token ids.
        topk: per generated step, ``{token_id: logprob}`` holding (at least) the top-k tokens; the chosen
            token may be added even when it is outside the top-k.
        prompt_logprobs: per prompt position ``{token_id: logprob}`` (top-k plus the actual prompt token),
            ``None`` at position 0; ``None`` as a whole when not computed.
        num_cached_tokens: prompt tokens served from a prefix cache, when the engine reports it.
        text: the generated text, for an engine that answers text only (``token_ids`` empty): the ids are
            then recovered against the reference by :func:`ids_from_text`.
    """

    token_ids: list[int]
    topk: list[LogprobDict]
    prompt_logprobs: list[LogprobDict | None] | None = None
    num_cached_tokens: int | None = None
    text: str | None = None

    @classmethod
    def coerce(cls, obj: Any) -> EngineOutput:
        """An EngineOutput from anything with ``token_ids`` and ``topk`` (or ``logprobs``), e.g. a golden
        output or a nanovllm_ref ``RequestOutput``."""
        if isinstance(obj, EngineOutput):
            return obj
        topk = getattr(obj, "topk", None)
        if topk is None:
            topk = getattr(obj, "logprobs", None) or []
        return cls(list(obj.token_ids), list(topk), getattr(obj, "prompt_logprobs", None),
                   getattr(obj, "num_cached_tokens", None))


def _ranked(d: LogprobDict) -> list[int]:
    return sorted(d, key=lambda t: (-d[t], t))


def _top(d: LogprobDict, k: int) -> list[int]:
    return _ranked(d)[:k]


def _kth_value(d: LogprobDict, k: int) -> float | None:
    """The k-th largest logprob when ``d`` holds a full top-k (any absent token is at most this), else None."""
    return d[_ranked(d)[k - 1]] if len(d) >= k else None


def _side(d: LogprobDict | None, tok: int) -> str:
    if d is None:
        return "no logprobs"
    if tok not in d:
        return "absent from top-k"
    return f"lp={d[tok]:.6g} rank {_ranked(d).index(tok) + 1}"


def describe_token(tok: int, ref: LogprobDict | None, cand: LogprobDict | None) -> str:
    """``token 123 (reference: lp=-0.1 rank 1; candidate: lp=-0.2 rank 2)``."""
    return f"token {tok} (reference: {_side(ref, tok)}; candidate: {_side(cand, tok)})"


class _Checker:
    """Value checks for one prompt; keeps the largest difference and the first violations."""

    def __init__(self, top_k: int, position_tol: Sequence[tuple[int, float]] = (), n_prompt: int | None = None) -> None:
        self.top_k, self.position_tol, self.n_prompt = top_k, tuple(position_tol), n_prompt
        self.max = {"gen": 0.0, "prompt": 0.0}
        self.where = {"gen": "", "prompt": ""}
        self.failures: list[str] = []
        self.gen_sum, self.gen_count = 0.0, 0  # every shared generated-step logprob, for the set's mean

    def bound(self, kind: str, pos: int, tol: float) -> float:
        """``tol`` raised to the position's bound (a generated step's position needs the prompt's length)."""
        at = pos if kind == "prompt" else None if self.n_prompt is None else self.n_prompt + pos
        for end, bound in self.position_tol if at is not None else ():  # ends increase: the first above `at`
            if at < end:
                return max(tol, bound)
        return tol

    def check(self, kind: str, pos: int, ref: LogprobDict, cand: LogprobDict, tol: float) -> None:
        label = f"{'gen step' if kind == 'gen' else 'prompt pos'} {pos}"
        tol = self.bound(kind, pos, tol)
        worst_tok, worst = None, -1.0
        for tok in ref.keys() & cand.keys():
            diff = abs(ref[tok] - cand[tok])
            if math.isnan(diff):
                diff = math.inf
            if diff > worst:
                worst_tok, worst = tok, diff
            if kind == "gen":
                self.gen_sum, self.gen_count = self.gen_sum + diff, self.gen_count + 1
        if worst_tok is not None and worst > self.max[kind]:
            self.max[kind], self.where[kind] = worst, f"{label}, {describe_token(worst_tok, ref, cand)}"
        if worst > tol:
            self.failures.append(f"{label}: |dlogprob| = {worst:.3g} > tol {tol:.3g} for "
                                 f"{describe_token(worst_tok, ref, cand)}")
        for a, b, name in ((ref, cand, "candidate"), (cand, ref, "reference")):
            kth = _kth_value(b, self.top_k)
            if kth is None:
                continue
            for tok in _top(a, self.top_k):
                if tok not in b and a[tok] - kth > tol:
                    self.failures.append(
                        f"{label}: {describe_token(tok, ref, cand)} is missing from the {name} top-{self.top_k} "
                        f"whose k-th logprob is {kth:.6g}, so |dlogprob| >= {a[tok] - kth:.3g} > tol {tol:.3g}")
                    break


def compare_outputs(
    reference: Any,
    candidate: Any,
    *,
    top_k: int = 20,
    tol: float,
    prompt_tol: float | None,
    prompt_id: str = "",
    allow_divergence: bool = True,
    prompt: Sequence[int] | None = None,
    tokens_only: bool = False,
    divergence_by_value: bool = False,
    position_tol: Sequence[tuple[int, float]] = (),
) -> PromptReport:
    """Compare one prompt's candidate generation to the reference (see the module docstring for the policy).

    ``reference`` / ``candidate`` are :class:`EngineOutput` or anything :meth:`EngineOutput.coerce` accepts.
    ``prompt_tol=None`` skips prompt logprobs; otherwise a candidate without them fails when the reference
    has them. With ``prompt`` (the prompt's token ids) every prompt-logprob dict must also hold the actual
    prompt token at its position, as vLLM's prompt logprobs do. ``position_tol``: see the module docstring.
    """
    ref, cand = EngineOutput.coerce(reference), EngineOutput.coerce(candidate)
    n_prompt = len(prompt) if prompt is not None else None if ref.prompt_logprobs is None else len(ref.prompt_logprobs)
    chk = _Checker(top_k, position_tol, n_prompt)
    first_div: int | None = None
    matched = 0
    for i in range(min(len(ref.token_ids), len(cand.token_ids))):
        if tokens_only:
            if ref.token_ids[i] != cand.token_ids[i]:
                first_div = i
                _tokens_only_divergence(chk, i, ref, cand.token_ids[i], top_k, allow_divergence)
                break
            matched += 1
            continue
        if i >= len(ref.topk) or i >= len(cand.topk):
            chk.failures.append(f"gen step {i}: missing logprobs (reference has {len(ref.topk)} steps, "
                                f"candidate {len(cand.topk)})")
            break
        r_d, c_d = ref.topk[i], cand.topk[i]
        chk.check("gen", i, r_d, c_d, tol)
        rt, ct = ref.token_ids[i], cand.token_ids[i]
        if rt != ct:
            first_div = i
            crossed = _admitted(rt, r_d, c_d, top_k, tol, divergence_by_value) and \
                _admitted(ct, c_d, r_d, top_k, tol, divergence_by_value)
            what = (f"gen step {i}: tokens differ: reference {describe_token(rt, r_d, c_d)} vs "
                    f"candidate {describe_token(ct, r_d, c_d)}")
            if not allow_divergence:
                chk.failures.insert(0, what + " (tokens must be exact here)")
            elif not crossed:
                chk.failures.insert(0, what + f": a token is outside the other side's top-{top_k}")
            break
        matched += 1
    if first_div is None and len(ref.token_ids) != len(cand.token_ids):
        chk.failures.insert(0, f"length mismatch: reference generated {len(ref.token_ids)} tokens, "
                               f"candidate {len(cand.token_ids)} (all {matched} shared tokens are equal)")
    if prompt_tol is not None and ref.prompt_logprobs is not None and not tokens_only:
        _check_prompt(chk, ref.prompt_logprobs, cand.prompt_logprobs, prompt_tol, prompt)
    report = _make_report(prompt_id, chk, ref, matched, first_div, top_k)
    if tokens_only:
        report.mode = TOKENS_ONLY
        report.message += " (tokens-only: no logprobs compared)"
    return report


def _admitted(tok: int, own: LogprobDict, other: LogprobDict, top_k: int, tol: float, by_value: bool) -> bool:
    """At a divergence: ``tok`` (chosen by the side whose dict is ``own``) is in the other side's top-k, or, by value,
    absent from it by at most ``tol`` (own logprob - the other's k-th)."""
    if tok in _top(other, top_k):
        return True
    kth = _kth_value(other, top_k)
    return by_value and kth is not None and tok in own and own[tok] - kth <= tol


def ids_from_text(text: str, reference: Any, decode: Any, top_k: int) -> list[int]:
    """The generated ids of a text-only answer, recovered along the reference (re-tokenizing the text would
    merge tokens differently): while the text continues the reference's decoded tokens, the ids are the
    reference's; at the first step where it does not, the id is the reference top-k token whose text continues
    it (the longest such), else -1 (a token outside the top-k), and recovery stops there, as the comparison does.
    ``decode(ids) -> str`` is the checkpoint's tokenizer; a trailing incomplete character is ignored."""
    ref = EngineOutput.coerce(reference)
    ids: list[int] = []
    for i, tok in enumerate(ref.token_ids):
        before, upto = decode(ref.token_ids[:i]), decode(ref.token_ids[:i + 1])
        if before == text and upto != before:  # the text ended before this step: the engine stopped
            return ids
        if text.startswith(upto.rstrip("\ufffd")):
            ids.append(tok)
            continue
        fits = [(len(decode(ref.token_ids[:i] + [t])), t) for t in _top(ref.topk[i], top_k)
                if text.startswith(decode(ref.token_ids[:i] + [t]).rstrip("\ufffd"))]
        return ids + [max(fits)[1] if fits else -1]
    return ids


def _tokens_only_divergence(chk: _Checker, i: int, ref: EngineOutput, ct: int, top_k: int, allow: bool) -> None:
    """The first differing token of a candidate without logprobs: it must be in the reference's top-k."""
    r_d = ref.topk[i] if i < len(ref.topk) else {}
    what = (f"gen step {i}: tokens differ: reference {describe_token(ref.token_ids[i], r_d, None)} vs "
            f"candidate {describe_token(ct, r_d, None)}")
    if not allow:
        chk.failures.insert(0, what + " (tokens must be exact here)")
    elif ct not in _top(r_d, top_k):
        chk.failures.insert(0, what + f": the candidate's token is outside the reference's top-{top_k}")


def _check_prompt(
    chk: _Checker, ref: list, cand: list | None, prompt_tol: float, prompt: Sequence[int] | None
) -> None:
    if cand is None:
        chk.failures.append("the candidate returned no prompt logprobs")
        return
    if len(cand) != len(ref):
        chk.failures.append(f"prompt logprobs: reference has {len(ref)} positions, candidate {len(cand)}")
    for pos, (r_d, c_d) in enumerate(zip(ref, cand)):
        if r_d is None or c_d is None:
            if (r_d is None) != (c_d is None):
                chk.failures.append(f"prompt pos {pos}: logprobs present on one side only")
            continue
        chk.check("prompt", pos, r_d, c_d, prompt_tol)
        if prompt is not None and pos < len(prompt):
            for d, name in ((c_d, "candidate"), (r_d, "reference")):
                if prompt[pos] not in d:
                    chk.failures.append(f"prompt pos {pos}: the actual prompt token {prompt[pos]} is missing from "
                                        f"the {name}'s prompt logprobs (has {_top(d, 5)}...)")


def _make_report(prompt_id: str, chk: _Checker, ref: EngineOutput, matched: int, first_div: int | None,
                 top_k: int) -> PromptReport:
    gen, prompt = chk.max["gen"], chk.max["prompt"]
    kind = "gen" if gen >= prompt else "prompt"
    where = chk.where[kind]
    worst = f"largest |dlogprob| {max(gen, prompt):.3g} at {where or '-'}"
    name = prompt_id or "prompt"
    if chk.failures:
        status = FAIL
        extra = f" (+{len(chk.failures) - 1} more)" if len(chk.failures) > 1 else ""
        message = f"[{name}] FAIL: {chk.failures[0]}{extra}; {matched} tokens matched; {worst}"
    elif first_div is not None:
        status = DIVERGED_OK
        r_d = ref.topk[first_div]
        message = (f"[{name}] diverged at gen step {first_div} (both tokens in each other's top-{top_k}, "
                   f"reference top-1 margin {_margin(r_d):.3g}); {worst}")
    else:
        status = MATCH
        message = f"[{name}] match: {matched} tokens; {worst}"
    return PromptReport(
        prompt_id=prompt_id, status=status, num_tokens=len(ref.token_ids), matched_tokens=matched,
        first_divergence=first_div, max_abs_diff=max(gen, prompt), where=where, max_gen_diff=gen,
        max_prompt_diff=prompt, message=message, failures=chk.failures, gen_diff_sum=chk.gen_sum,
        gen_diff_count=chk.gen_count,
    )


def _margin(d: LogprobDict) -> float:
    r = _ranked(d)
    return d[r[0]] - d[r[1]] if len(r) > 1 else math.inf


def compare_all(
    reference: Sequence[Any],
    candidate: Sequence[Any],
    *,
    top_k: int = 20,
    tol: float,
    prompt_tol: float | None,
    prompt_ids: Sequence[str] | None = None,
    allow_divergence: bool = True,
    prompts: Sequence[Sequence[int]] | None = None,
    model: str = "",
    dtype: str = "",
    engine: str = "",
    case: str = "",
    meta: dict[str, Any] | None = None,
    tokens_only: bool = False,
    mean_tol: float | None = None,
    divergence_by_value: bool = False,
    position_tol: Sequence[tuple[int, float]] = (),
) -> ConformanceReport:
    """:func:`compare_outputs` for every prompt (``prompts``: their token ids, to check the actual prompt tokens
    in the prompt logprobs); ``model``/``dtype``/``engine``/``case`` label the rows; ``tokens_only``: the
    policy for candidates without logprobs (module docstring); ``mean_tol``: the bound on the set's mean
    generated-step |dlogprob| (a failure of the set, in ``report.set_failures``)."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference outputs but {len(candidate)} candidate outputs")
    ids = list(prompt_ids) if prompt_ids is not None else [f"prompt_{i}" for i in range(len(reference))]
    report = ConformanceReport(meta=dict(meta or {}))
    for i, (pid, r, c) in enumerate(zip(ids, reference, candidate)):
        p = compare_outputs(r, c, top_k=top_k, tol=tol, prompt_tol=prompt_tol, prompt_id=pid,
                            allow_divergence=allow_divergence, prompt=prompts[i] if prompts is not None else None,
                            tokens_only=tokens_only, divergence_by_value=divergence_by_value,
                            position_tol=position_tol)
        p.model, p.dtype, p.engine, p.case = model, dtype, engine, case
        report.prompts.append(p)
    count = sum(p.gen_diff_count for p in report.prompts)
    mean = sum(p.gen_diff_sum for p in report.prompts) / count if count else 0.0
    if mean_tol is not None and mean > mean_tol:  # NaN differences are inf: they fail here too
        worst = sorted(report.prompts, key=lambda p: -p.gen_diff_sum / max(p.gen_diff_count, 1))[:3]
        report.set_failures.append({
            "model": model, "dtype": dtype, "engine": engine, "case": case, "mean": mean, "mean_tol": mean_tol,
            "message": f"mean |dlogprob| over the {count} shared top-{top_k} logprobs of the generated steps of all "
                       f"{len(report.prompts)} prompts is {mean:.3g} > mean_tol {mean_tol:.3g}: a systematic "
                       f"difference, whatever the per-position bound {tol:.3g} says (largest means: "
                       + ", ".join(f"{p.prompt_id} {p.gen_diff_sum / max(p.gen_diff_count, 1):.3g}" for p in worst)
                       + ")"})
    return report
