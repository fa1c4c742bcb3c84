"""A mixture-of-experts checkpoint with near-tied router logits: where the router's precision shows.

transformers' Qwen3-MoE router (``modeling_qwen3_moe.py``, ``Qwen3MoeTopKRouter``) takes the gate's logits in the
model dtype, then ``softmax(router_logits, dtype=torch.float)``, top-k of those float32 probabilities, renormalized
when ``norm_topk_prob``, and only then casts the weights to the model dtype. vLLM 0.32's CUDA ``fused_topk`` fills
float32 weights (its ``topk_softmax`` kernel); its CPU router (``fused_moe/router/cpu_router.py`` ``_softmax_topk``)
takes the top-k of the logits themselves, the experts float32 probabilities pick (ties aside), and the softmax of
those k only, whose bf16 rounding is the weights' own. An engine that takes the softmax (or the top-k of the
probabilities) in bfloat16 instead passes the bf16 goldens of a trained checkpoint: its router logits are spread
(qwen3-moe-tiny: std 0.75, median gap 0.27 between the k-th and the next expert), so bf16 probabilities rarely tie
(0.2% of the token x layer rows there pick other experts) and the weights round to bf16 either way.

:func:`near_tied_router_checkpoint` derives the checkpoint where they do: every router gate weight
(``*.mlp.gate.weight``, Qwen3-MoE's name; Mixtral's ``*.block_sparse_moe.gate.weight``) times ``ROUTER_SCALE`` =
2**-10, nothing else changed. A power of two commutes with rounding, so a hidden state's bf16 logits are the
checkpoint's own / 1024 exactly: their order and relative spacing, hence how robust float32 routing is to an
engine's float noise, stay the trained checkpoint's. But the logits are now ~1e-3, so the probabilities are
1/E (1 + O(1e-3)) while bf16 resolves 2**-8 = 3.9e-3 relative (at 1/8, one step is 4.9e-4 below it and 9.8e-4
above): a bf16 softmax rounds nearly a whole row to one or two values, and its top-k picks the lowest expert ids
instead of the largest logits (first sparse layer of qwen3-moe-tiny over the golden prompts' tokens: other experts
in 96.5% of the rows, against 0.27% on the checkpoint; tests/oracle/test_moe_router.py). The routing
weights become near uniform (1/k normalized, 1/E not); the greedy margins stay (bf16, median top-1 margin and steps
under 0.05: qwen3-moe-tiny 1.12 / 2.6% against the golden's 1.31 / 2.0%, qwen3-moe-unnorm-hd32 1.25 / 2.9% against
1.56 / 1.9%).

Measured in bf16 on qwen3-moe-tiny / qwen3-moe-unnorm-hd32 (23 golden prompts x 32 greedy tokens against
transformers eager; the mean |dlogprob| over the generated steps' shared top-20 logprobs; conformance/README.md,
"MoE router precision"): transformers sdpa (the noise) 0.038 / 0.039, so mean_tol 0.113 / 0.117; nanovllm_ref
0.039 / 0.040; nanovllm_ref with its softmax in bf16 (tools/mutants.py ``moe-router-softmax-bf16``) 1.20 / 0.92,
10.6x / 7.8x mean_tol, every prompt diverging by step 5 / 16, while on the golden checkpoints that mutant's means are
0.034 / 0.048 (mean_tol 0.147: it passes them, as the unmutated engine's 0.036 / 0.049 do). The check's bound is the
suite's rule for a live reference: 3 x the measured noise, per position and for the set's mean (tolerances.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .derived import link_checkpoint

ROUTER_SCALE = 2.0**-10
GATE = re.compile(r"\.(?:mlp|block_sparse_moe)\.gate\.weight$")  # the router's linear, not an expert's gate_proj


def is_moe_checkpoint(model_path: str | os.PathLike) -> bool:
    """Whether config.json describes a mixture of experts (``num_experts_per_tok``, as tolerances.py pools them)."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    return config.get("num_experts_per_tok") is not None


def _gate_files(src: Path) -> list[Path]:
    """The safetensors files of ``src`` that hold a router gate weight (read from their headers only)."""
    from safetensors import safe_open

    return [f for f in sorted(src.glob("*.safetensors"))
            if any(GATE.search(k) for k in safe_open(str(f), framework="pt").keys())]


def near_tied_router_checkpoint(src: str | os.PathLike, dst: str | os.PathLike) -> str:
    """Write ``src`` with every router gate weight times :data:`ROUTER_SCALE` into the folder ``dst`` (the files
    without one linked; each that has one written anew, so a large checkpoint costs a copy of those); returns
    ``dst``. ValueError when ``src`` has no such tensor in safetensors files (another router name, .bin weights)."""
    from safetensors.torch import load_file, save_file

    src = Path(src).resolve()
    files = _gate_files(src)
    if not files:
        raise ValueError(f"{src}: no router gate weight ({GATE.pattern}) in its safetensors files")
    out = link_checkpoint(src, dst, replaced=[f.name for f in files])
    for f in files:
        tensors = {k: v * ROUTER_SCALE if GATE.search(k) else v for k, v in load_file(str(f)).items()}
        save_file(tensors, str(out / f.name), metadata={"format": "pt"})
    return str(out)
