"""The per-capability verdict of a conformance run: what the engine was checked on, and what it was not.

An engine that implements only the minimal protocol (``EngineAdapter``: ``name``, ``generate``, ``close``) runs the
greedy goldens and a few reference-free cases; every case that needs more (``run_requests``, ``stream_requests``,
an engine setting, a server URL, ``--kernels``) skips, saying why. A run's counts alone ("20 passed, 121 skipped")
read as green; this verdict says, per capability, whether it was checked, and for those that were not, the
adapter method or option that enables them and the reason the cases gave. The oracle's own self-tests
(``test_policy.py``) are counted apart, never as the engine's passes.

A test maps to a capability by its module and name (:data:`RULES`); a conformance module may name its own with a
module-level ``CAPABILITY = "..."``; a module neither knows is its own capability (``test_foo_bar.py``: "foo bar"),
described by its skip reasons. Plain Python: the summary prints in any environment the suite is installed into.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

WIDTH = 120
SELF_TESTS = "oracle self-tests"


@dataclass(frozen=True)
class Capability:
    name: str
    enabled_by: str  # what an adapter (or the command line) needs for the capability's cases to run


CAPABILITIES = {c.name: c for c in (
    Capability("goldens", "generate (the minimal protocol)"),
    Capability("top-k logprobs", "generate's topk (returns_logprobs)"),
    Capability("prompt logprobs", "generate's prompt_logprobs"),
    Capability("config dialects", "generate"),
    Capability("sampling", "run_requests (oracle/requests.py)"),
    Capability("seeds", "run_requests with seed"),
    Capability("logprobs modes", "run_requests with logprobs_mode"),
    Capability("text", "run_requests' text; stream_requests"),
    Capability("stops", "run_requests' finish_reason, stop_reason"),
    Capability("request workload", "run_requests"),
    Capability("prefix cache", "run_requests' num_cached_tokens + prefix_cache_kwargs"),
    Capability("invariance", "--engine nanovllm_ref (its engine settings)"),
    Capability("batch invariance", "generate; --engine-arg max_num_batched_tokens=N"),
    Capability("self-consistency", "run_requests with logprobs"),
    Capability("fp8 kv cache", "--engine-arg kv_cache_dtype=fp8"),
    Capability("engine modes", "modes() (the engine's advertised settings)"),
    Capability("speculative decoding", "speculative_configs() or --speculative-config JSON"),
    Capability("abort", "abort_requests (oracle/requests.py)"),
    Capability("eos", "generate on a checkpoint folder"),
    Capability("moe router", "generate on a checkpoint folder (a MoE --model)"),
    Capability("sampling edges", "run_requests"),
    Capability("structured outputs", "run_requests with structured_outputs (oracle/requests.py)"),
    Capability("serving", "--engine openai:URL"),
    Capability("kernels", "--kernels pkg.module:function"),
    Capability(SELF_TESTS, "the comparison policy's own tests"),
)}

# (module stem, test-name prefix or "" for any) -> capability; the first rule that matches wins
RULES: tuple[tuple[str, str, str], ...] = (
    ("test_golden", "", "goldens"),
    ("test_config_dialects", "", "config dialects"),
    ("test_sampling", "test_seeded", "seeds"),
    ("test_sampling", "test_stop_string", "stops"),
    ("test_sampling", "", "sampling"),
    ("test_sampling_steps", "test_seeded", "seeds"),
    ("test_sampling_steps", "test_logprobs_modes", "logprobs modes"),
    ("test_sampling_steps", "", "sampling"),
    ("test_text", "test_stop_reason", "stops"),
    ("test_text", "", "text"),
    ("test_workload", "", "request workload"),
    ("test_prefix_cache", "", "prefix cache"),
    ("test_invariance", "", "invariance"),
    ("test_batch_invariance", "test_needle_seeded", "seeds"),
    ("test_batch_invariance", "", "batch invariance"),
    ("test_self_consistency", "", "self-consistency"),
    ("test_fp8_kv", "", "fp8 kv cache"),
    ("test_engine_modes", "", "engine modes"),
    ("test_spec_decode", "", "speculative decoding"),
    ("test_spec_decode_sampling", "", "speculative decoding"),
    ("test_serving", "", "serving"),
    ("test_kernels", "", "kernels"),
    ("test_policy", "", SELF_TESTS),
)


def capability_of(module_stem: str, test_name: str, declared: str | None = None) -> str:
    """The capability of test ``test_name`` of conformance module ``module_stem`` (``declared``: the module's own
    ``CAPABILITY``)."""
    if declared:
        return declared
    for stem, prefix, name in RULES:
        if stem == module_stem and test_name.startswith(prefix):
            return name
    return module_stem.removeprefix("test_").replace("_", " ")


@dataclass
class Tally:
    """The outcomes of one capability's tests; ``reasons``: skip reason -> cases."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    deselected: int = 0
    reasons: Counter = field(default_factory=Counter)

    def state(self) -> str:
        if self.failed:
            return "FAILED"
        if not self.passed:
            return "NOT CHECKED"
        return "partly" if self.skipped else "checked"

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.state(), "passed": self.passed, "failed": self.failed, "skipped": self.skipped,
                "deselected": self.deselected, "skip_reasons": dict(self.reasons)}

    def counts(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.passed, "passed"), (self.failed, "failed"),
                                                (self.skipped, "skipped"), (self.deselected, "deselected")) if n]
        return ", ".join(parts) or "no cases"


def tally(outcomes: dict[str, tuple[str, str]], capability: dict[str, str],
          deselected: list[str] = ()) -> dict[str, Tally]:
    """Per capability, the tallies of ``outcomes`` (nodeid -> (outcome, skip reason)); ``capability`` maps each
    suite test's nodeid to its capability (tests outside the suite are left out)."""
    out: dict[str, Tally] = {}
    for nodeid, (outcome, reason) in outcomes.items():
        if nodeid not in capability:
            continue
        t = out.setdefault(capability[nodeid], Tally())
        if outcome == "passed":
            t.passed += 1
        elif outcome == "skipped":
            t.skipped += 1
            t.reasons[reason] += 1
        else:
            t.failed += 1
    for nodeid in deselected:
        if nodeid in capability:
            out.setdefault(capability[nodeid], Tally()).deselected += 1
    return out


def record_capabilities(tallies: dict[str, Tally], reports: list[dict[str, Any]]) -> None:
    """Add the two capabilities the comparisons themselves tell (``reports``: each recorded comparison's meta):
    top-k logprobs (a comparison in logprobs mode, not tokens-only) and prompt logprobs (one that compared them)."""
    compared = [m for m in reports if "mode" in m]
    if not compared:
        return
    for name, done in (("top-k logprobs", [m for m in compared if m.get("mode") == "logprobs"]),
                       ("prompt logprobs", [m for m in compared if m.get("prompt_logprobs")])):
        tallies[name] = Tally(passed=len(done)) if done else Tally(
            skipped=len(compared), reasons=Counter({"every comparison ran without them": len(compared)}))


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def verdict_lines(tallies: dict[str, Tally], width: int = WIDTH) -> list[str]:
    """One row per capability (known ones in their order, then the others), then the verdict: the engine
    capabilities checked and those not, the self-tests apart."""
    order = [n for n in CAPABILITIES if n in tallies] + sorted(n for n in tallies if n not in CAPABILITIES)
    engine = [n for n in order if n != SELF_TESTS]
    name_w = max([len(n) for n in order] + [10])
    lines = [f"{'capability'.ljust(name_w)}  {'verdict'.ljust(11)}  pass  fail  skip  enabled by | why not checked"]
    for name in order:
        t = tallies[name]
        enabled = CAPABILITIES[name].enabled_by if name in CAPABILITIES else "(see the skip reason)"
        reason = "" if t.state() == "checked" else t.reasons.most_common(1)[0][0] if t.reasons else (
            "deselected (-k, -m or the default sweep)" if t.deselected else "")
        counts = "  ".join(str(n).rjust(4) for n in (t.passed, t.failed, t.skipped + t.deselected))
        row = f"{name.ljust(name_w)}  {t.state().ljust(11)}  {counts}  {enabled}" + (f" | {reason}" if reason else "")
        lines.append(_clip(row, width))
    checked = [n for n in engine if tallies[n].state() in ("checked", "partly", "FAILED")]
    missing = [n for n in engine if tallies[n].state() == "NOT CHECKED"]
    passed = sum(tallies[n].passed for n in engine if n not in ("top-k logprobs", "prompt logprobs"))
    failed = sum(tallies[n].failed for n in engine)
    text = (f"capability verdict: the engine was checked on {len(checked)} of {len(engine)} capabilities "
            f"({passed} engine tests passed, {failed} failed)")
    text += f"; NOT CHECKED: {', '.join(missing)}" if missing else ""
    if SELF_TESTS in tallies:
        text += f"; the oracle's self-tests ({tallies[SELF_TESTS].counts()}) are not the engine's"
    lines += _wrap(text, width)
    return lines


def _wrap(text: str, width: int) -> list[str]:
    out, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = "  " + word
        else:
            line = f"{line} {word}" if line else word
    return out + [line] if line else out
