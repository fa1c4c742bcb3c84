"""Golden checkpoints in the rope_scaling config dialect (oracle/dialects.py): the view rewrites only the RoPE fields,
nanovllm_ref's loader reads either dialect (config.py ``rope_parameters``) and passes the goldens through the
view, and the suite takes ``CKPT@rope_scaling`` as a golden model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from golden.load import checkpoint_path
from nanovllm_ref.config import rope_parameters
from nanovllm_ref.oracle.dialects import legacy_rope_config, legacy_view, split_dialect


def test_legacy_config_of_llama3_scaling() -> None:
    cfg = json.loads((Path(checkpoint_path("llama3-tiny")) / "config.json").read_text())
    legacy = legacy_rope_config(cfg)
    assert "rope_parameters" not in legacy
    assert legacy["rope_theta"] == 500000.0
    assert legacy["rope_scaling"] == {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                      "original_max_position_embeddings": 256, "rope_type": "llama3"}
    assert {k: v for k, v in legacy.items() if k not in ("rope_scaling", "rope_theta")} == \
        {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_theta")}


def test_legacy_config_of_default_rope_is_null_scaling() -> None:
    legacy = legacy_rope_config({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert legacy == {"rope_theta": 1e6, "rope_scaling": None}
    assert legacy_rope_config(legacy) == legacy  # already legacy: unchanged
    with pytest.raises(ValueError, match="rope_theta"):
        legacy_rope_config({"rope_parameters": {"rope_type": "default"}})


def test_split_dialect() -> None:
    assert split_dialect("qwen3-tiny") == ("qwen3-tiny", "rope_parameters")
    assert split_dialect("qwen3-tiny@rope_scaling") == ("qwen3-tiny", "rope_scaling")
    with pytest.raises(ValueError, match="unknown config dialect 'yarn'"):
        split_dialect("qwen3-tiny@yarn")


@pytest.mark.parametrize("config, expected", [
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, (5e5, "llama3")),
    ({"rope_parameters": {"rope_type": "default"}, "rope_theta": 7e4}, (7e4, "default")),  # theta at the top
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "rope_theta": 5e5}, (5e5, "llama3")),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 1e4}, (1e4, "linear")),  # v4's "type"
    ({"rope_scaling": None, "rope_theta": 1e6}, (1e6, "default")),
])
def test_engine_reads_both_dialects(config, expected) -> None:
    params = rope_parameters(SimpleNamespace(**config))
    assert (params["rope_theta"], params["rope_type"]) == expected


def test_view_links_weights_and_rewrites_config(tmp_path) -> None:
    view = Path(legacy_view(checkpoint_path("llama3-bias-hd32"), tmp_path))
    assert (view / "model.safetensors").resolve() == (Path(checkpoint_path("llama3-bias-hd32")) /
                                                      "model.safetensors").resolve()
    cfg = json.loads((view / "config.json").read_text())
    assert cfg["rope_scaling"]["rope_type"] == "llama3" and "rope_parameters" not in cfg
    assert legacy_view(checkpoint_path("llama3-bias-hd32"), tmp_path) == str(view)  # made once


def test_copies_of_one_checkpoint_get_their_own_views(tmp_path) -> None:
    # one config in two folders (two checkouts): each view links into its own folder, so deleting one copy
    # leaves the other's view whole
    src = Path(checkpoint_path("qwen3-tiny"))
    copies = []
    for name in ("a", "b"):
        copy = tmp_path / name / "qwen3-tiny"
        copy.mkdir(parents=True)
        for f in src.iterdir():
            if f.is_file():
                (copy / f.name).write_bytes(f.read_bytes())
        copies.append(copy)
    views = [Path(legacy_view(c, tmp_path / "cache")) for c in copies]
    assert views[0] != views[1]
    for copy, view in zip(copies, views):
        assert (view / "model.safetensors").resolve() == (copy / "model.safetensors").resolve()


def test_nanovllm_ref_passes_the_goldens_through_the_legacy_view(tmp_path) -> None:
    from nanovllm_ref.oracle.adapters import NanovllmRefAdapter
    from nanovllm_ref.oracle.references import golden_reference, run_check
    from nanovllm_ref.oracle.tolerances import golden_tolerance

    adapter = NanovllmRefAdapter(legacy_view(checkpoint_path("llama3-tiny"), tmp_path), "float32")
    try:
        report = run_check(adapter, golden_reference("llama3-tiny", "float32"),
                           golden_tolerance("float32", checkpoint="llama3-tiny"))
    finally:
        adapter.close()
    assert report.passed, report.format_failures()
    assert all(p.status == "match" for p in report.prompts)


def test_a_server_engine_skips_the_view_it_cannot_be_handed() -> None:
    """A server serves the checkpoint it was started with: the dialect module skips there (naming how to serve the
    view) instead of failing the server's checkpoint check; in-process engines get the view's folder."""
    from nanovllm_ref.oracle.adapters import server_url

    assert server_url("openai:http://127.0.0.1:8011/v1") == "http://127.0.0.1:8011/v1"
    assert server_url("vllm") is None and server_url("nanovllm_ref") is None
    assert server_url("pkg.module:factory") is None
