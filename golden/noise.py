"""Statistics recorded in the manifest: top-1 margins of the goldens and measured float noise.

* :func:`margin_stats` - how peaked the distributions are: ``logprob(top1) - logprob(top2)`` and
  the max probability, over generated steps and over prompt positions.
* :func:`compare` - absolute differences of top-k logprobs between the golden run and a second
  way of computing the same thing, on matched tokens (token ids present in both top-k lists at
  the same position). Generated steps are compared up to and including the first step where the
  greedy tokens differ (after it the contexts differ).
"""

from __future__ import annotations

import torch


def _describe(values: torch.Tensor) -> dict:
    v = values.double()
    if v.numel() == 0:
        return {"count": 0}
    return {
        "count": int(v.numel()),
        "median": float(v.median()),
        "mean": float(v.mean()),
        "p10": float(torch.quantile(v, 0.10)),
        "min": float(v.min()),
    }


def _margins(top_vals: torch.Tensor) -> dict:
    stats = _describe(top_vals[:, 0] - top_vals[:, 1])
    if top_vals.shape[0]:
        stats["mean_max_prob"] = float(top_vals[:, 0].double().exp().mean())
        stats["num_margin_below_1e-3"] = int(((top_vals[:, 0] - top_vals[:, 1]) < 1e-3).sum())
    return stats


def margin_stats(results: list[dict]) -> dict:
    """Top-1 margin / max-prob statistics over generated steps and over prompt positions."""
    gen = torch.cat([r["topk_logprobs"] for r in results])
    prompt = torch.cat([r["prompt_topk_logprobs"] for r in results])
    return {"generated": _margins(gen), "prompt": _margins(prompt)}


def _matched_diffs(ids_a, vals_a, ids_b, vals_b) -> torch.Tensor:
    """|vals_a - vals_b| for every (row, token) present in both top-k lists; shapes (N, k)."""
    match = ids_a[:, :, None] == ids_b[:, None, :]
    diff = (vals_a[:, :, None].double() - vals_b[:, None, :].double()).abs()
    return diff[match]


def _summary(diffs: torch.Tensor) -> dict:
    if diffs.numel() == 0:
        return {"count": 0, "max": 0.0, "p99": 0.0, "mean": 0.0}
    return {
        "count": int(diffs.numel()),
        "max": float(diffs.max()),
        "p99": float(torch.quantile(diffs, 0.99)),
        "mean": float(diffs.mean()),
    }


def compare(ref: list[dict], alt: list[dict]) -> dict:
    """Noise between two runs over the same prompts (see module docstring)."""
    prompt_diffs, gen_diffs, divergences = [], [], {}
    top1_flips = 0
    for i, (a, b) in enumerate(zip(ref, alt)):
        assert a["prompt"] == b["prompt"]
        prompt_diffs.append(
            _matched_diffs(
                a["prompt_topk_ids"], a["prompt_topk_logprobs"], b["prompt_topk_ids"], b["prompt_topk_logprobs"]
            )
        )
        top1_flips += int((a["prompt_topk_ids"][:, 0] != b["prompt_topk_ids"][:, 0]).sum())
        differ = (a["token_ids"] != b["token_ids"]).nonzero()
        n = len(a["token_ids"]) if differ.numel() == 0 else int(differ[0, 0]) + 1
        if differ.numel():
            divergences[i] = int(differ[0, 0])
        gen_diffs.append(
            _matched_diffs(a["topk_ids"][:n], a["topk_logprobs"][:n], b["topk_ids"][:n], b["topk_logprobs"][:n])
        )
    p, g = torch.cat(prompt_diffs), torch.cat(gen_diffs)
    return {
        "all": _summary(torch.cat([p, g])),
        "prompt": _summary(p),
        "generated": _summary(g),
        "prompt_top1_flips": top1_flips,
        "greedy_divergences": {"num_prompts": len(divergences), "first_step_by_prompt_index": divergences},
    }


def summarize(checkpoints: dict) -> dict:
    """Per dtype: worst max / p99 over checkpoints, overall and per comparison method."""
    out: dict = {}
    for info in checkpoints.values():
        for dtype, methods in info["noise"].items():
            s = out.setdefault(dtype, {"max_abs_diff": 0.0, "p99_abs_diff": 0.0, "greedy_divergent_prompts": 0})
            for method, res in methods.items():
                m = s.setdefault(method, {"max_abs_diff": 0.0, "p99_abs_diff": 0.0})
                for d in (s, m):
                    d["max_abs_diff"] = max(d["max_abs_diff"], res["all"]["max"])
                    d["p99_abs_diff"] = max(d["p99_abs_diff"], res["all"]["p99"])
                s["greedy_divergent_prompts"] += res["greedy_divergences"]["num_prompts"]
    return out
