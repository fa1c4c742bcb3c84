"""The near-tied router view (nanovllm_ref/oracle/moe_router.py) and the check built on it
(conformance/test_moe_router.py): the view changes only the router gates, keeps float32 routing where the
checkpoint had it and ties bf16 softmax rows; a bf16 router fails the check's bound while nanovllm_ref passes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from golden.load import checkpoint_path
from nanovllm_ref.oracle.adapters import HFAdapter, NanovllmRefAdapter
from nanovllm_ref.oracle.moe_router import GATE, ROUTER_SCALE, is_moe_checkpoint, near_tied_router_checkpoint
from nanovllm_ref.oracle.references import golden_reference, live_reference, run_check
from nanovllm_ref.oracle.tolerances import noise_tolerance

MODEL = "qwen3-moe-tiny"  # layers 0 and 2 sparse (8 experts, top-2), layer 1 dense


@pytest.fixture(scope="module")
def view(tmp_path_factory) -> str:
    return near_tied_router_checkpoint(checkpoint_path(MODEL), tmp_path_factory.mktemp("router") / MODEL)


def test_the_view_scales_the_router_gates_and_nothing_else(view: str) -> None:
    src = Path(checkpoint_path(MODEL))
    before, after = load_file(str(src / "model.safetensors")), load_file(str(Path(view) / "model.safetensors"))
    assert before.keys() == after.keys()
    gates = sorted(k for k in before if GATE.search(k))
    assert gates == ["model.layers.0.mlp.gate.weight", "model.layers.2.mlp.gate.weight"]
    for k, t in before.items():
        assert torch.equal(after[k], t * ROUTER_SCALE if k in gates else t), k
    links = {f.name: f.resolve() for f in Path(view).iterdir() if f.is_symlink()}
    assert links == {f.name: f.resolve() for f in src.iterdir() if f.name != "model.safetensors"}
    assert is_moe_checkpoint(view) and not is_moe_checkpoint(checkpoint_path("qwen3-tiny"))


def test_a_checkpoint_without_a_router_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no router gate weight"):
        near_tied_router_checkpoint(checkpoint_path("qwen3-tiny"), tmp_path / "v")


def first_router_logits(path: str, prompts: list[list[int]]) -> torch.Tensor:
    """The bf16 logits of the first sparse layer's router for every prompt token (transformers)."""
    hf = HFAdapter(path, "bfloat16")
    rows = []
    router = next(m for m in hf.model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter")
    handle = router.register_forward_hook(lambda mod, args, out: rows.append(out[0]))
    with torch.inference_mode():
        for p in prompts:
            hf.model(input_ids=torch.tensor([p]))
    handle.remove()
    return torch.cat(rows)


def flipped(logits: torch.Tensor, k: int = 2) -> float:
    """The share of rows whose top-k experts differ between a float32 and a bf16 softmax."""
    def chosen(probs: torch.Tensor) -> torch.Tensor:
        return probs.topk(k, dim=-1).indices.sort(dim=-1).values

    return (chosen(logits.float().softmax(-1)) != chosen(logits.softmax(-1))).any(-1).float().mean().item()


def test_float32_routing_is_the_checkpoints_and_bf16_softmax_rows_tie(view: str) -> None:
    prompts = golden_reference(MODEL, "float32").prompts[:8]
    golden, near = first_router_logits(checkpoint_path(MODEL), prompts), first_router_logits(view, prompts)
    assert torch.equal(near, golden * ROUTER_SCALE)  # a power of two: the same logits, float32 routing unchanged
    assert flipped(golden) < 0.01 < 0.5 < flipped(near)


def bf16_router(self, hidden_states):  # transformers' Qwen3MoeTopKRouter.forward with the softmax in bf16
    logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
    if self.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return logits, weights, ids


def test_a_bf16_router_fails_the_check_and_nanovllm_ref_passes(view: str, monkeypatch) -> None:
    import transformers.models.qwen3_moe.modeling_qwen3_moe as hf_moe

    g = golden_reference(MODEL, "float32")
    ref = live_reference(MODEL, view, "bfloat16", g.prompts, g.prompt_ids, max_tokens=8)
    n = ref.meta["noise"]
    tol = noise_tolerance("bfloat16", n["generated"], n["prompt"], n["method"], n["mean"])
    engine = NanovllmRefAdapter(view, "bfloat16")
    try:
        report = run_check(engine, ref, tol)
    finally:
        engine.close()
    assert report.passed, report.format_failures()
    monkeypatch.setattr(hf_moe.Qwen3MoeTopKRouter, "forward", bf16_router)
    wrong = run_check(HFAdapter(view, "bfloat16"), ref, tol)
    assert [f["mean"] > 3 * f["mean_tol"] for f in wrong.set_failures] == [True], wrong.format_failures()
