"""Compute the golden outputs with transformers and write them, plus ``golden/manifest.json``.

For every checkpoint and dtype (float32, bfloat16) and every prompt of :func:`build_prompts`:
greedy decoding of ``NUM_NEW_TOKENS`` tokens with EOS disabled (manual loop: model forward +
``DynamicCache``), top-``TOP_K`` logprobs at each step and prompt logprobs, computed with
``attn_implementation="eager"`` on CPU, one prompt at a time, no padding. Logprobs are
``log_softmax`` in float32 of the logits cast to float32; greedy = argmax, ties -> lowest id.

The same outputs are recomputed two other ways (``sdpa`` one prompt at a time; ``eager`` batched
with left padding) to measure the float noise recorded in the manifest (see ``golden/noise.py``).
"""

from __future__ import annotations

import inspect
import json
import platform
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from golden import noise
from golden.load import GOLDEN_DIR, MANIFEST_PATH, OUTPUTS_DIR, checkpoint_path, list_checkpoints, output_paths
from golden.make_checkpoints import EOS_ID, NUM_THREADS, prompt_source_files, read_text

NUM_NEW_TOKENS = 32
TOP_K = 20
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REGENERATE = "nox -s golden   (= python -m golden.make; goldens only: python -m golden.make --goldens-only)"

# (name, length, start offset into the prompt-source token stream); offsets are arbitrary but fixed.
PLAIN_PROMPTS = [
    ("single_a", 1, 101),
    ("single_b", 1, 2203),
    ("short_2", 2, 307),
    ("short_3", 3, 4409),
    ("short_5", 5, 5011),
    ("short_8", 8, 6113),
    ("short_12", 12, 7219),
    ("block_15", 15, 8317),
    ("block_16", 16, 9419),
    ("block_17", 17, 10513),
    ("block_31", 31, 11617),
    ("block_32", 32, 12721),
    ("block_33", 33, 13829),
    ("block_64", 64, 14923),
    ("long_70", 70, 16033),
    ("long_130", 130, 18143),
    ("long_300", 300, 21247),
]


def build_prompts(tokenizer) -> list[dict]:
    """The fixed prompt set in ``tokenizer``'s ids: dicts with ``name``, ``ids`` and a ``note`` (the same names,
    lengths and offsets into the tokenized text for every tokenizer)."""
    text = "\n".join(read_text(p) for p in prompt_source_files())
    stream = tokenizer(text, verbose=False)["input_ids"]
    eos = tokenizer.eos_token_id
    assert eos not in stream
    prompts = [
        {"name": n, "ids": stream[o : o + n_tok], "note": f"stream[{o}:{o + n_tok}]"} for n, n_tok, o in PLAIN_PROMPTS
    ]
    base, s = stream[30011 : 30011 + 48], 30011
    prompts.append({"name": "shared48_prefix", "ids": base, "note": "the shared 48-token prefix itself"})
    firsts: set[int] = set()
    for name, start, n_suffix in (("shared48_a", s + 48, 5), ("shared48_b", 33000, 17), ("shared48_c", 36000, 30)):
        while stream[start] in firsts:  # (a tokenizer with a token as common as an indent: the next one)
            start += 1
        firsts.add(stream[start])
        prompts.append(
            {
                "name": name,
                "ids": base + stream[start : start + n_suffix],
                "note": f"shared48_prefix + stream[{start}:{start + n_suffix}]",
            }
        )
    firsts = {p["ids"][48] for p in prompts[-3:]}
    assert len(firsts) == 3, "shared-prefix suffixes must differ at their first token"
    r = 40001
    prompts.append({"name": "prefix_of_next", "ids": stream[r : r + 40], "note": f"stream[{r}:{r + 40}]"})
    prompts.append({"name": "extends_prev", "ids": stream[r : r + 100], "note": f"stream[{r}:{r + 100}]"})
    for p in prompts:
        assert p["ids"] and eos not in p["ids"], p["name"]
    return prompts


def _topk(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k over the last dim, ties broken by lowest token id (stable sort)."""
    vals, ids = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    return ids[..., :k], vals[..., :k]


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def _cache_kwarg(model) -> str:
    """``cache`` in recent transformers, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def run_batch(model, prompts: list[list[int]], left_pad: bool = False) -> list[dict]:
    """Greedy decode a list of prompts: one at a time (``left_pad=False``) or as one left-padded batch."""
    from transformers import DynamicCache

    groups = [prompts] if left_pad else [[p] for p in prompts]
    results = []
    for group in groups:
        width = max(len(p) for p in group)
        ids = torch.full((len(group), width), EOS_ID, dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for b, p in enumerate(group):
            ids[b, width - len(p) :] = torch.tensor(p)
            mask[b, width - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = {_cache_kwarg(model): DynamicCache(config=model.config)}
        kwargs = dict(attention_mask=mask, position_ids=pos) if left_pad else {}
        lp = _logprobs(model(input_ids=ids, use_cache=True, **cache, **kwargs).logits)
        prompt_lp = [lp[b, width - len(p) : -1] for b, p in enumerate(group)]  # row i predicts token i+1
        steps = []
        for _ in range(NUM_NEW_TOKENS):
            last = lp[:, -1]
            top_ids, top_vals = _topk(last, TOP_K)
            tok = top_ids[:, 0]
            steps.append((tok, last.gather(-1, tok[:, None])[:, 0], top_ids, top_vals))
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            pos = pos[:, -1:] + 1
            kwargs = dict(attention_mask=mask, position_ids=pos) if left_pad else {}
            lp = _logprobs(model(input_ids=tok[:, None], use_cache=True, **cache, **kwargs).logits)
        for b, p in enumerate(group):
            targets = torch.tensor(p[1:], dtype=torch.long)
            p_top_ids, p_top_vals = _topk(prompt_lp[b], TOP_K)
            results.append(
                {
                    "prompt": p,
                    "token_ids": torch.stack([s[0][b] for s in steps]),
                    "token_logprobs": torch.stack([s[1][b] for s in steps]),
                    "topk_ids": torch.stack([s[2][b] for s in steps]),
                    "topk_logprobs": torch.stack([s[3][b] for s in steps]),
                    "prompt_token_logprobs": prompt_lp[b].gather(-1, targets[:, None])[:, 0],
                    "prompt_topk_ids": p_top_ids,
                    "prompt_topk_logprobs": p_top_vals,
                }
            )
    return results


def to_tensors(results: list[dict]) -> dict[str, torch.Tensor]:
    """Flatten per-prompt results into the stored layout (position 0 rows: id -1, logprob nan)."""
    nan_row = torch.full((1, TOP_K), float("nan"))
    lengths = [len(r["prompt"]) for r in results]
    offsets = torch.tensor([0] + lengths).cumsum(0)
    return {
        "prompt_token_ids": torch.tensor([t for r in results for t in r["prompt"]], dtype=torch.int32),
        "prompt_offsets": offsets.to(torch.int64),
        "prompt_token_logprobs": torch.cat(
            [torch.cat([torch.tensor([float("nan")]), r["prompt_token_logprobs"]]) for r in results]
        ).float(),
        "prompt_topk_ids": torch.cat(
            [torch.cat([torch.full((1, TOP_K), -1), r["prompt_topk_ids"]]) for r in results]
        ).to(torch.int32),
        "prompt_topk_logprobs": torch.cat([torch.cat([nan_row, r["prompt_topk_logprobs"]]) for r in results]).float(),
        "output_token_ids": torch.stack([r["token_ids"] for r in results]).to(torch.int32),
        "output_token_logprobs": torch.stack([r["token_logprobs"] for r in results]).float(),
        "output_topk_ids": torch.stack([r["topk_ids"] for r in results]).to(torch.int32),
        "output_topk_logprobs": torch.stack([r["topk_logprobs"] for r in results]).float(),
    }


def load_model(name: str, dtype: str, attn: str = "eager"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint_path(name), dtype=DTYPES[dtype], attn_implementation=attn)
    return model.eval()


def settings_dict(name: str, dtype: str, prompts: list[dict]) -> dict:
    return {
        "checkpoint": name,
        "dtype": dtype,
        "device": "cpu",
        "attn_implementation": "eager",
        "num_new_tokens": NUM_NEW_TOKENS,
        "top_k": TOP_K,
        "eos_stops_generation": False,
        "batching": "one prompt at a time, no padding",
        "greedy_tie_break": "lowest token id",
        "logprobs": "log_softmax(logits.float()) in float32",
        "prompt_position_0": "no logprob: prompt_topk_ids row = -1, logprob rows = nan",
        "prompts": [{"name": p["name"], "length": len(p["ids"]), "source": p["note"]} for p in prompts],
    }


def sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(report: dict) -> None:
    import safetensors
    import tokenizers
    import transformers

    files = sorted(p for d in ("checkpoints", "outputs") for p in (GOLDEN_DIR / d).rglob("*") if p.is_file())
    manifest = {
        "format_version": 1,
        "regenerate": REGENERATE,
        "verify": "python -m golden.verify",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__,
        },
        "device": "cpu",
        "machine": platform.machine(),
        "torch_num_threads": NUM_THREADS,
        "dtypes": list(DTYPES),
        "settings": {
            "num_new_tokens": NUM_NEW_TOKENS,
            "top_k": TOP_K,
            "attn_implementation": "eager",
            "eos_stops_generation": False,
            "batching": "one prompt at a time, no padding",
            "prompts": {p["name"]: len(p["ids"]) for p in report["prompts"]},
        },
        "definitions": {
            "margins": "logprob(top1) - logprob(top2) and max prob, over the 32 greedy steps of all prompts "
            "('generated') and over prompt positions >= 1 ('prompt')",
            "noise": "|golden - other| of top-20 logprobs on matched token ids; generated steps up to and "
            "including the first greedy divergence; same dtype; see golden/noise.py",
        },
        "checkpoints": report["checkpoints"],
        "noise_summary": report["noise_summary"],
        "files": {p.relative_to(GOLDEN_DIR).as_posix(): sha256(p) for p in files},
    }
    MANIFEST_PATH.write_text(json.dumps(manifest, indent=2) + "\n")


def main(names: list[str] | None = None) -> None:
    """Goldens of every checkpoint, or only of `names` (the other checkpoints' outputs and manifest entries are
    kept as they are; the noise summary is recomputed over all)."""
    from transformers import AutoTokenizer

    torch.set_num_threads(NUM_THREADS)
    OUTPUTS_DIR.mkdir(parents=True, exist_ok=True)
    for old in OUTPUTS_DIR.iterdir():
        if not names or old.name.split(".")[0] in names:
            old.unlink()
    kept = json.loads(MANIFEST_PATH.read_text())["checkpoints"] if names else {}
    names = names or list_checkpoints()
    report: dict = {"checkpoints": {k: v for k, v in kept.items() if k not in names}}
    for name in names:
        prompts = build_prompts(AutoTokenizer.from_pretrained(checkpoint_path(name)))  # in the checkpoint's own ids
        ids = [p["ids"] for p in prompts]
        report.setdefault("prompts", prompts)  # (names and lengths: the same for every tokenizer)
        entry = json.loads((Path(checkpoint_path(name)) / "config.json").read_text())
        train = json.loads((Path(checkpoint_path(name)) / "train_stats.json").read_text())
        keys = (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "tie_word_embeddings",
            "rope_theta",
            "vocab_size",
            "num_experts",
            "num_local_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "norm_topk_prob",
            "mlp_only_layers",
            "decoder_sparse_step",
        )
        info = report["checkpoints"][name] = {
            "architecture": entry["architectures"][0],
            "config": {k: entry[k] for k in keys if k in entry},
            "train": train,
            "margins": {},
            "noise": {},
        }
        for dtype in DTYPES:
            t0 = time.time()
            golden = run_batch(load_model(name, dtype), ids)
            tensor_path, settings_path = output_paths(name, dtype)
            # a single metadata key: safetensors writes several in a random order (bytes would vary)
            save_file(to_tensors(golden), str(tensor_path), metadata={"golden": f"{name} {dtype}"})
            settings_path.write_text(json.dumps(settings_dict(name, dtype, prompts), indent=2) + "\n")
            info["margins"][dtype] = noise.margin_stats(golden)
            info["noise"][dtype] = {
                "sdpa_one_at_a_time": noise.compare(golden, run_batch(load_model(name, dtype, "sdpa"), ids)),
                "eager_batched_left_pad": noise.compare(golden, run_batch(load_model(name, dtype), ids, True)),
            }
            print(f"{name} {dtype}: {time.time() - t0:.1f}s margins {info['margins'][dtype]['generated']}")
    report["checkpoints"] = dict(sorted(report["checkpoints"].items()))
    report["noise_summary"] = noise.summarize(report["checkpoints"])
    write_manifest(report)
    print(json.dumps(report["noise_summary"], indent=2))


if __name__ == "__main__":
    main()
