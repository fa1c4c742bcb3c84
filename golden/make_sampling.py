"""Sampling goldens: transformers' own logits processors on the golden checkpoints (run only by hand).

    python -m golden.make_sampling            # writes golden/sampling/<checkpoint>.<dtype>.json + manifest.json
    python -m golden.make_sampling NAME ...   # only these checkpoints; the others' files and manifest entries stay

For each checkpoint, dtype (float32, bfloat16) and the first PROMPTS golden prompts of at least 5 tokens:
- `greedy`: greedy decoding of NUM_NEW_TOKENS tokens (EOS never stops it) under RepetitionPenaltyLogitsProcessor
  with each penalty of REPETITION_PENALTIES (the argmax of the penalized logits, lowest id on ties), with the
  top-TOP_K log-softmax of the penalized logits at every step;
- `processed`: for each warper setting of WARPERS, the top-TOP_K processed logprobs (transformers' processors
  in its order, see golden/hf_sampling.py) of the next token after each prompt cut at
  CUTS fixed lengths (the positions where they are measured).
Logits come from the model with eager attention on the CPU, one sequence at a time, no padding, no cache (the
full sequence is recomputed at every step), cast to float32. conformance/test_sampling.py::test_sampling_golden*
compares an engine with them.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import torch

from golden.hf_sampling import ReferenceSampler
from golden.load import checkpoint_path, list_checkpoints, load_golden

SAMPLING_DIR = Path(__file__).resolve().parent / "sampling"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PROMPTS = 4
NUM_NEW_TOKENS = 24
TOP_K = 20
REPETITION_PENALTIES = (0.8, 1.3)
CUTS = (5, 8, 16)  # prompt lengths whose next-token distribution is recorded (capped at the prompt's length)
WARPERS = {
    "temperature-0.7": {"temperature": 0.7},
    "top-k-10": {"top_k": 10},
    "top-p-0.8": {"top_p": 0.8},
    "min-p-0.05-temperature-1.3": {"min_p": 0.05, "temperature": 1.3},
    "repetition-penalty-1.3": {"repetition_penalty": 1.3},
    "all-warpers": {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.02},
}


def golden_prompts(name: str) -> list[list[int]]:
    return [p for p in load_golden(name, "float32").prompts if len(p) >= 5][:PROMPTS]


def _top(scores: torch.Tensor, k: int) -> dict[str, float]:
    logprobs = scores.float().log_softmax(dim=-1)
    values, ids = torch.sort(logprobs, descending=True, stable=True)
    return {str(int(t)): float(v) for t, v in zip(ids[:k], values[:k]) if v > float("-inf")}


def greedy(ref: ReferenceSampler, prompt: list[int], penalty: float) -> dict:
    tokens, tops = [], []
    for _ in range(NUM_NEW_TOKENS):
        scores = ref.scores(prompt, tokens, {"temperature": 0.0, "repetition_penalty": penalty})
        tokens.append(int(torch.argmax(scores)))  # the first maximum: the lowest id on ties
        tops.append(_top(scores, TOP_K))
    return {"prompt": prompt, "repetition_penalty": penalty, "token_ids": tokens, "top_logprobs": tops}


def processed(ref: ReferenceSampler, prompt: list[int]) -> list[dict]:
    rows = []
    for cut in sorted({min(c, len(prompt)) for c in CUTS}):
        for name, params in WARPERS.items():
            rows.append({"prompt": prompt[:cut], "setting": name, "params": params,
                         "top_logprobs": _top(ref.scores(prompt[:cut], [], params), TOP_K)})
    return rows


def main(argv: list[str] | None = None) -> None:
    import sys

    names = (sys.argv[1:] if argv is None else argv) or list_checkpoints()
    unknown = sorted(set(names) - set(list_checkpoints()))
    if unknown:
        raise SystemExit(f"unknown golden checkpoints {unknown}; known: {list_checkpoints()}")
    torch.set_num_threads(1)
    SAMPLING_DIR.mkdir(exist_ok=True)
    files, counts = _kept_entries(names)
    for name in names:
        prompts = golden_prompts(name)
        for dtype, torch_dtype in DTYPES.items():
            ref = ReferenceSampler(checkpoint_path(name), torch_dtype)
            data = {"checkpoint": name, "dtype": dtype,
                    "greedy": [greedy(ref, p, r) for p in prompts for r in REPETITION_PENALTIES],
                    "processed": [row for p in prompts for row in processed(ref, p)]}
            path = SAMPLING_DIR / f"{name}.{dtype}.json"
            path.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n")
            counts[path.name] = {"greedy": len(data["greedy"]), "processed": len(data["processed"])}
            files[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()  # golden.verify checks these
            print(f"{path.name}: {counts[path.name]}", flush=True)
    import transformers

    manifest = {"regenerate": "python -m golden.make_sampling", "versions": {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "settings": {"prompts": f"the first {PROMPTS} golden prompts of >= 5 tokens", "num_new_tokens": NUM_NEW_TOKENS,
                     "top_k": TOP_K, "repetition_penalties": list(REPETITION_PENALTIES), "cuts": list(CUTS),
                     "warpers": WARPERS, "attn_implementation": "eager", "device": "cpu"},
        "counts": dict(sorted(counts.items())), "files": dict(sorted(files.items()))}
    (SAMPLING_DIR / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _kept_entries(names: list[str]) -> tuple[dict, dict]:
    """(files: hashes, counts) of the manifest for the checkpoints not regenerated now. They must have been made
    by the same versions: a partial run under others would leave a manifest that misstates them, so it is refused."""
    path = SAMPLING_DIR / "manifest.json"
    if not path.is_file() or set(names) == set(list_checkpoints()):
        return {}, {}
    import transformers

    old = json.loads(path.read_text())
    now = {"torch": torch.__version__, "transformers": transformers.__version__}
    if any(old["versions"].get(k) != v for k, v in now.items()):
        raise SystemExit(f"golden/sampling was made with {old['versions']}, this is {now}: regenerate all checkpoints")
    keep = {f for f in old["files"] if f.split(".")[0] not in names}
    return ({f: h for f, h in old["files"].items() if f in keep}, {f: c for f, c in old["counts"].items() if f in keep})


if __name__ == "__main__":
    main()
