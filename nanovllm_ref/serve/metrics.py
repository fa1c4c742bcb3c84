"""Prometheus metrics at `GET /metrics` (prometheus-client, the serve extra), under vLLM's names.

The names, types and labels are vLLM's (its `v1/metrics/loggers.py`), `vllm:` prefix included, so that a
dashboard or alert written for a vLLM server reads this one unchanged; every series carries `model_name` (the
first served name). What is counted, as in vLLM:

    vllm:num_requests_running / vllm:num_requests_waiting   gauges: sequences the scheduler runs / queues
    vllm:kv_cache_usage_perc                                gauge: used fraction of the KV blocks (0..1)
    vllm:request_success_total{finished_reason}             finished requests (stop, length, abort, error)
    vllm:prompt_tokens_total / vllm:generation_tokens_total prompt tokens at prefill; output tokens as produced
    vllm:time_to_first_token_seconds                        arrival -> first output token
    vllm:request_time_per_output_token_seconds              per request: (end - first token) / (tokens - 1)
    vllm:e2e_request_latency_seconds                        arrival -> end
    vllm:request_prompt_tokens / vllm:request_generation_tokens   per-request sizes

Each server owns its registry (two servers in one process, as in the tests, do not share counters).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..outputs import RequestOutput
from .engine_loop import LoopObserver

# vLLM's buckets, with finer ones below 10 ms for per-token times on a GPU
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))  # 1 .. 500,000


class ServerMetrics(LoopObserver):
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str) -> None:
        self.registry = registry = CollectorRegistry()
        label = {"model_name": model_name}

        def make(kind: type, name: str, doc: str, **kw: object) -> object:
            return kind(name, doc, ["model_name", *kw.pop("labels", ())], registry=registry, **kw)

        self.running = make(Gauge, "vllm:num_requests_running", "Sequences in the running batch").labels(**label)
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "Sequences waiting to be scheduled").labels(**label)
        self.kv_usage = make(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage (1 = full)").labels(**label)
        self.success = make(Counter, "vllm:request_success", "Finished requests by finish reason",
                            labels=("finished_reason",))
        self.model_name = model_name
        self.prompt_tokens = make(Counter, "vllm:prompt_tokens", "Prompt tokens prefilled").labels(**label)
        self.generation_tokens = make(Counter, "vllm:generation_tokens", "Tokens generated").labels(**label)
        self.ttft = make(Histogram, "vllm:time_to_first_token_seconds", "Time to first token (s)",
                         buckets=TTFT_BUCKETS).labels(**label)
        self.tpot = make(Histogram, "vllm:request_time_per_output_token_seconds", "Mean time per output token "
                         "after the first, per request (s)", buckets=TPOT_BUCKETS).labels(**label)
        self.e2e = make(Histogram, "vllm:e2e_request_latency_seconds", "End-to-end request latency (s)",
                        buckets=E2E_BUCKETS).labels(**label)
        self.request_prompt = make(Histogram, "vllm:request_prompt_tokens", "Prompt tokens per request",
                                   buckets=TOKEN_BUCKETS).labels(**label)
        self.request_generation = make(Histogram, "vllm:request_generation_tokens", "Output tokens per request "
                                       "(all n samples)", buckets=TOKEN_BUCKETS).labels(**label)

        self.spec = {name: make(Counter, f"vllm:spec_decode_{name}", doc).labels(**label) for name, doc in (
            ("num_drafts", "Speculative verifications (one sequence's drafts each)"),
            ("num_draft_tokens", "Draft tokens verified"), ("num_accepted_tokens", "Draft tokens accepted"))}
        self.spec_per_pos = make(Counter, "vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, "
                                 "by position in the draft", labels=("position",))
        self.spec_seen: dict[str, int] = {}  # the engine's totals already counted

    def on_step(self, stats: dict) -> None:
        self.running.set(stats["num_running"])
        self.waiting.set(stats["num_waiting"])
        self.kv_usage.set(stats["kv_cache_usage"])
        if stats.get("spec_decoding"):
            self._count_spec(stats["spec_decoding"])

    def _count_spec(self, spec: dict) -> None:
        """The engine's spec-decode totals into the counters (by the increase since the last step)."""
        totals = {name: spec[name] for name in self.spec}
        totals |= {f"pos{i}": n for i, n in enumerate(spec["accepted_per_position"])}
        for key, total in totals.items():
            new = total - self.spec_seen.get(key, 0)
            if new > 0:
                counter = self.spec.get(key) or self.spec_per_pos.labels(model_name=self.model_name,
                                                                          position=key.removeprefix("pos"))
                counter.inc(new)
            self.spec_seen[key] = total

    def on_first_token(self, num_prompt_tokens: int, ttft_s: float) -> None:
        self.prompt_tokens.inc(num_prompt_tokens)
        self.ttft.observe(ttft_s)

    def on_tokens(self, num_tokens: int) -> None:
        self.generation_tokens.inc(num_tokens)

    def on_finished(self, out: RequestOutput, arrival: float, first_token: float | None, now: float) -> None:
        self.success.labels(model_name=self.model_name, finished_reason=out.finish_reason or "abort").inc()
        self.e2e.observe(now - arrival)
        num_out = sum(len(o.token_ids) for o in out.outputs or [out])
        self.request_prompt.observe(len(out.prompt_token_ids))
        self.request_generation.observe(num_out)
        longest = max((len(o.token_ids) for o in out.outputs or [out]), default=0)
        if first_token is not None and longest > 1:
            self.tpot.observe((now - first_token) / (longest - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
