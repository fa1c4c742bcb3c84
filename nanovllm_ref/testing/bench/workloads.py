"""Benchmark workloads: token-id prompts and per-request output lengths (EOS is always ignored).

- `headline()`: nano-vllm's bench.py exactly: `random.seed(0)`; 256 requests, each a prompt length
  `randint(100, 1024)` then that many ids `randint(0, 10000)`; after all prompts, one output length
  `randint(100, 1024)` per request. Totals: 142,827 prompt and 133,966 output tokens.
- `scaled(...)`: the same recipe with fewer requests and shorter lengths (CPU smoke, quick checks).
- `prefix_heavy(...)`: one shared system prompt (1,024 tokens by default) plus a short random user suffix
  per request: what the prefix cache is for.
- `uniform(...)`: n identical-shape requests (latency runs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

HEADLINE_PROMPT_TOKENS = 142_827
HEADLINE_OUTPUT_TOKENS = 133_966


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    output_lens: list[int]
    temperature: float = 0.6  # nano-vllm's bench samples at 0.6
    notes: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.output_lens):
            raise ValueError("one output length per prompt is needed")

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def max_len(self) -> int:
        """Longest prompt + output (max_model_len must hold it)."""
        return max(len(p) + o for p, o in zip(self.prompts, self.output_lens))

    def subset(self, n: int) -> Workload:
        """The first n requests (peers that are too slow for the whole workload)."""
        return Workload(f"{self.name}[:{n}]", self.prompts[:n], self.output_lens[:n], self.temperature,
                        {**self.notes, "subset_of": self.name, "subset_requests": n})

    def with_temperature(self, temperature: float) -> Workload:
        return Workload(self.name, self.prompts, self.output_lens, temperature, self.notes)

    def with_penalties(self, fraction: float) -> Workload:
        """A fraction of the requests, spread evenly, with penalties (runner.PENALTIES): the check
        that plain requests keep their speed next to them."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"penalized fraction must be in [0, 1], got {fraction}")
        return Workload(self.name, self.prompts, self.output_lens, self.temperature,
                        {**self.notes, "penalized_fraction": fraction})

    def summary(self) -> dict[str, object]:
        return {"workload": self.name, "requests": self.num_requests, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "temperature": self.temperature, **self.notes}


def scaled(
    num_requests: int = 256, max_prompt: int = 1024, max_output: int = 1024, min_prompt: int = 100,
    min_output: int = 100, max_token_id: int = 10000, seed: int = 0, name: str | None = None,
) -> Workload:
    """nano-vllm's recipe (prompts drawn first, then output lengths) with any sizes."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, max_token_id) for _ in range(rng.randint(min_prompt, max_prompt))]
               for _ in range(num_requests)]
    output_lens = [rng.randint(min_output, max_output) for _ in range(num_requests)]
    if name is None:
        name = f"scaled-{num_requests}x{max_prompt}x{max_output}"
    return Workload(name, prompts, output_lens)


def headline() -> Workload:
    """nano-vllm's headline benchmark (bench.py), token for token."""
    w = scaled(256, 1024, 1024, name="headline")
    return w


def decode_contexts(w: Workload, step: int) -> list[int]:
    """Context lengths of the sequences still running at decode step `step` when every request is admitted at
    once (the headline at full batch): prompt + step + 1 for each request with more than `step` outputs."""
    return [len(p) + step + 1 for p, n in zip(w.prompts, w.output_lens) if n > step]


def smoke(num_requests: int = 8, max_prompt: int = 48, max_output: int = 12) -> Workload:
    """A CPU-sized version of the headline recipe."""
    return scaled(num_requests, max_prompt, max_output, min_prompt=max(1, max_prompt // 4),
                  min_output=max(1, max_output // 4), name=f"smoke-{num_requests}")


def prefix_heavy(
    num_requests: int = 256, system_len: int = 1024, min_suffix: int = 16, max_suffix: int = 128,
    output_len: int = 128, max_token_id: int = 10000, seed: int = 1,
) -> Workload:
    """A shared system prompt plus a short random suffix per request; fixed output length."""
    rng = random.Random(seed)
    system = [rng.randint(0, max_token_id) for _ in range(system_len)]
    prompts = [system + [rng.randint(0, max_token_id) for _ in range(rng.randint(min_suffix, max_suffix))]
               for _ in range(num_requests)]
    return Workload(f"prefix-{num_requests}x{system_len}", prompts, [output_len] * num_requests,
                    notes={"shared_prefix_tokens": system_len})


def uniform(num_requests: int, prompt_len: int, output_len: int, max_token_id: int = 10000, seed: int = 2) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randint(0, max_token_id) for _ in range(prompt_len)] for _ in range(num_requests)]
    return Workload(f"uniform-{num_requests}x{prompt_len}x{output_len}", prompts, [output_len] * num_requests)


WORKLOADS = {
    "headline": headline,
    "prefix": prefix_heavy,
    "smoke": smoke,
    "prefix-smoke": lambda: prefix_heavy(8, system_len=64, min_suffix=4, max_suffix=16, output_len=8),
}


def get(name: str) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {sorted(WORKLOADS)}")
    return WORKLOADS[name]()
