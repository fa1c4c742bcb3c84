"""Speculative decoding in the conformance suite: the configs an engine is checked with, its acceptance counts, and
the lines the end of a run prints about them (conformance/test_spec_decode*.py use it).

An adapter takes part through optional methods (each case that needs one skips, naming it, on an adapter without):

* ``speculative_configs(model_path) -> {name: engine settings}`` on the adapter's factory (a staticmethod, as
  ``prefix_cache_kwargs``: the suite reads it when it collects the cases, before any engine is built), e.g.
  ``{"ngram-k3": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3, ...}}}``;
* ``spec_decode_stats() -> (num_draft_tokens, num_accepted_tokens[, num_drafts]) | None``: the engine's counts
  since it started (vLLM's ``vllm:spec_decode_*`` counters), so the suite can tell that speculation happened and
  report its acceptance rate and mean acceptance length (1 + accepted / verifications, vLLM's definition);
* ``rejection_sampler()``: a callable with ``kernels/rejection.py``'s ``rejection_sample_reference`` signature (CPU
  tensors in and out), run through ``oracle/rejection_check.py``.

``--speculative-config JSON`` adds one config (``{"speculative_config": JSON}``) for any engine whose factory takes
``speculative_config``; for an OpenAI server (``openai:URL``) it declares the config the server was started with,
and the counts are read from the server's ``/metrics`` (``prometheus_spec_counts``). References: vLLM
tests/v1/spec_decode (test_ngram.py, the acceptance-length tests) and tests/v1/sample/test_rejection_sampler.py;
Leviathan et al. 2023 (the rule that keeps the target's distribution).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ENABLED_BY = ("the adapter's speculative_configs(model_path) (nanovllm_ref, vllm) or --speculative-config JSON "
              "(an engine whose factory takes speculative_config)")


@dataclass(frozen=True)
class SpecConfig:
    """One speculative config of one checkpoint: its name and the engine settings that turn it on."""

    model: Any  # conformance/harness.py's ModelSpec
    name: str | None  # None: the engine advertises none (every case skips, naming ENABLED_BY)
    settings: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.model.name}-{self.name or 'no-config'}"

    @property
    def speculative(self) -> dict[str, Any]:
        return dict(self.settings.get("speculative_config") or {})

    @property
    def k(self) -> int:
        return int(self.speculative.get("num_speculative_tokens", 1))

    @property
    def draft_is_target(self) -> bool:
        """The draft model is the target checkpoint itself: every draft must be accepted (p = q)."""
        draft = self.speculative.get("model")
        return draft is not None and os.path.realpath(draft) == os.path.realpath(self.model.path)


def option_config(raw: str | None) -> tuple[str, dict[str, Any]] | None:
    """``--speculative-config JSON`` as (name, engine settings), None without it; a ValueError says what is wrong."""
    if not raw:
        return None
    value = json.loads(raw)
    if not isinstance(value, dict) or not value:
        raise ValueError("expected a JSON object of the engine's speculative_config fields")
    method = value.get("method") or ("draft" if "model" in value else "spec")
    return f"option-{method}-k{value.get('num_speculative_tokens', '?')}", {"speculative_config": value}


def configs_for(factory: Callable | None, model: Any, option: str | None) -> list[SpecConfig]:
    """The configs of one checkpoint: the factory's advertised ones, then the option's; one placeholder if none."""
    advertise = getattr(factory, "speculative_configs", None)
    named = dict(advertise(model.path)) if callable(advertise) else {}
    extra = option_config(option)
    if extra is not None:
        named[extra[0]] = extra[1]
    return [SpecConfig(model, n, s) for n, s in named.items()] or [SpecConfig(model, None, {})]


NGRAM = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def ngram_configs(ks: Sequence[int], **extra: Any) -> dict[str, dict[str, Any]]:
    """Prompt-lookup configs with k = each of ``ks`` drafts (vLLM's names), ``extra`` engine settings beside."""
    return {f"ngram-k{k}": {"speculative_config": {**NGRAM, "num_speculative_tokens": k}, **extra} for k in ks}


def same_tokenizer(a: str, b: str) -> bool:
    """Whether two checkpoint folders hold the same tokenizer.json and vocabulary size (a draft model's condition)."""
    def files(path: str) -> tuple[bytes, int] | None:
        try:
            with open(os.path.join(path, "tokenizer.json"), "rb") as f, open(os.path.join(path, "config.json")) as c:
                return f.read(), json.load(c)["vocab_size"]
        except (OSError, KeyError, ValueError):
            return None

    return files(a) is not None and files(a) == files(b)


def nanovllm_ref_configs(model_path: str) -> dict[str, dict[str, Any]]:
    """nanovllm_ref's: prompt lookup with 1, 3 and 5 drafts; the target as its own draft model (k = 3: every draft
    must be accepted); its first half of layers as a draft with k = 1 and 5 (a layer-skip draft: some drafts
    rejected, some accepted, so steps after a rejection are checked too); and for another checkpoint sharing
    qwen3-tiny's tokenizer, qwen3-tiny as a smaller draft."""
    from golden.load import checkpoint_path

    from .derived import first_layers_checkpoint

    configs = ngram_configs((1, 3, 5))
    configs["draft-self-k3"] = {"speculative_config": {"model": model_path, "num_speculative_tokens": 3}}
    with open(os.path.join(model_path, "config.json")) as f:
        depth = int(json.load(f).get("num_hidden_layers", 1))
    if depth >= 2:
        half = first_layers_checkpoint(model_path, depth // 2)
        for k in (1, 5):
            configs[f"draft-layers-k{k}"] = {"speculative_config": {"model": half, "num_speculative_tokens": k}}
    tiny = checkpoint_path("qwen3-tiny")
    if os.path.realpath(tiny) != os.path.realpath(model_path) and same_tokenizer(tiny, model_path):
        configs["draft-qwen3-tiny-k3"] = {"speculative_config": {"model": tiny, "num_speculative_tokens": 3}}
    return configs


@dataclass(frozen=True)
class SpecCounts:
    num_draft_tokens: int
    num_accepted_tokens: int
    num_drafts: int | None = None  # verifications (one per sequence and step with drafts); None: not reported

    def __sub__(self, other: SpecCounts) -> SpecCounts:
        drafts = None if self.num_drafts is None or other.num_drafts is None else self.num_drafts - other.num_drafts
        return SpecCounts(self.num_draft_tokens - other.num_draft_tokens,
                          self.num_accepted_tokens - other.num_accepted_tokens, drafts)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None


SPEC_COUNTERS = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens",
                 "vllm:spec_decode_num_drafts")  # spec_decode_stats' order


def prometheus_spec_counts(text: str) -> tuple[int, int, int] | None:
    """SPEC_COUNTERS' values in a Prometheus exposition (a server's ``/metrics``: vLLM's and nanovllm_ref's), summed
    over their labels (``_total`` suffixed, as prometheus_client writes counters); None where one is missing."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else line.partition(" ")
        name = name.removesuffix("_total")
        if name in SPEC_COUNTERS and not line.startswith("#"):
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[-1])
    return tuple(int(values[n]) for n in SPEC_COUNTERS) if all(n in values for n in SPEC_COUNTERS) else None


def read_counts(adapter: Any) -> SpecCounts | None:
    """The adapter's ``spec_decode_stats()`` as SpecCounts; None where it has none or reports none."""
    stats = getattr(adapter, "spec_decode_stats", None)
    value = stats() if callable(stats) else None
    return None if value is None else SpecCounts(*(int(v) for v in value))


def speculation_meta(config: SpecConfig, dtype: str, case: str, counts: SpecCounts | None) -> dict[str, Any]:
    """What a case records about its run (the JSON report's ``speculative`` entries, the summary's lines)."""
    meta = {"model": config.model.name, "dtype": dtype, "config": config.name, "case": case,
            "settings": config.speculative}
    if counts is not None:
        meta.update(num_draft_tokens=counts.num_draft_tokens, num_accepted_tokens=counts.num_accepted_tokens,
                    num_drafts=counts.num_drafts, acceptance_rate=counts.acceptance_rate,
                    mean_acceptance_length=counts.mean_acceptance_length)
    return meta


def summary_lines(metas: Sequence[dict[str, Any]], width: int = 120, verbose: bool = False) -> list[str]:
    """The summary's lines: one per checkpoint and config, its runs' counts summed (drafts accepted, the rate, the
    mean acceptance length); with ``verbose`` one per recorded run (the JSON report keeps every run either way)."""
    if not verbose:
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for m in metas:
            groups.setdefault((m["model"], m["config"]), []).append(m)
        metas = [_summed(model, config, runs) for (model, config), runs in groups.items()]
    lines = []
    for m in metas:
        head = f"{m['model']}{'/' + m['dtype'] if 'dtype' in m else ''} {m['config']}, {m['case']}:"
        if "num_draft_tokens" not in m:
            lines.append(f"{head} no counts reported (spec_decode_stats)")
            continue
        length = m.get("mean_acceptance_length")
        tail = f", mean acceptance length {length:.2f}" if length is not None else ""
        lines.append(f"{head} {m['num_accepted_tokens']}/{m['num_draft_tokens']} drafts accepted "
                     f"({m['acceptance_rate']:.3f}){tail}")
    return [line if len(line) <= width else line[: width - 3] + "..." for line in lines]


def _summed(model: str, config: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    counted = [r for r in runs if "num_draft_tokens" in r]
    out = {"model": model, "config": config, "case": f"{len(runs)} runs (-v: each)"}
    if counted:
        drafts, accepted = (sum(r[k] for r in counted) for k in ("num_draft_tokens", "num_accepted_tokens"))
        verifications = [r.get("num_drafts") for r in counted]
        total = SpecCounts(drafts, accepted, None if None in verifications else sum(verifications))
        out.update(num_draft_tokens=drafts, num_accepted_tokens=accepted, acceptance_rate=total.acceptance_rate,
                   mean_acceptance_length=total.mean_acceptance_length)
    return out
