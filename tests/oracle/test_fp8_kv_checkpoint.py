"""The fp8-kv tier's scaled checkpoint (oracle/fp8_kv.py scaled_checkpoint): the scales under vLLM's names, one
per KV head, and config.json declaring them as compressed-tensors' KV cache scheme (what vLLM needs to create the
k/v_scale parameters at all: without it vLLM refuses the checkpoint); nanovllm_ref reads the scales, the oracle's
transformers reference loads the weights without the declaration, the source checkpoint is left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nanovllm_ref.kernels.kv_quant import kv_scales_from_checkpoint
from nanovllm_ref.oracle import fp8_kv
from nanovllm_ref.oracle.adapters import HFAdapter

from ..conftest import checkpoint_path

MODEL = "qwen3-gqa4"  # 3 layers, 2 KV heads


@pytest.fixture(scope="module")
def scales() -> dict[int, torch.Tensor]:
    return {i: torch.tensor([[0.011, 0.017], [0.0021, 0.0034]]) * (1 + i) for i in range(3)}


@pytest.fixture(scope="module")
def scaled(tmp_path_factory, scales) -> Path:
    return Path(
        fp8_kv.scaled_checkpoint(str(checkpoint_path(MODEL)), str(tmp_path_factory.mktemp("ck") / MODEL), scales)
    )


def test_config_declares_a_per_head_fp8_kv_cache_scheme(scaled):
    src = json.loads((Path(checkpoint_path(MODEL)) / "config.json").read_text())
    assert "quantization_config" not in src, "the golden checkpoint itself must stay unquantized"
    assert not (scaled / "config.json").is_symlink()
    cfg = json.loads((scaled / "config.json").read_text())
    q = cfg.pop("quantization_config")
    assert cfg == src  # nothing else changed
    # what vLLM 0.32 accepts (CompressedTensorsKVCacheMethod.validate_kv_cache_scheme) and loads per KV head
    assert q["quant_method"] == "compressed-tensors" and q["config_groups"] == {}
    kv = q["kv_cache_scheme"]
    assert (kv["type"], kv["num_bits"], kv["strategy"], kv["symmetric"], kv["dynamic"]) == (
        "float",
        8,
        "attn_head",
        True,
        False,
    )
    for f in Path(checkpoint_path(MODEL)).iterdir():  # the weights are the source's
        if f.name != "config.json":
            assert (scaled / f.name).resolve() == f.resolve()


def test_scales_by_vllm_names_and_read_back(scaled, scales):
    from safetensors.torch import load_file

    names = set(load_file(str(scaled / "kv_scales.safetensors")))
    assert names == {f"model.layers.{i}.self_attn.{n}_scale" for i in range(3) for n in "kv"}
    got = kv_scales_from_checkpoint(str(scaled), 3, 2)  # nanovllm_ref's loader
    assert torch.equal(got, torch.stack([scales[i] for i in range(3)]))
    assert {i: s.tolist() for i, s in fp8_kv.read_scales(str(scaled)).items()} == {
        i: s.tolist() for i, s in scales.items()
    }


def test_reference_loads_the_weights_without_the_declaration(scaled):
    plain = HFAdapter(str(checkpoint_path(MODEL)), "float32")
    ref = HFAdapter(str(scaled), "float32", quantization=False)
    try:
        assert not hasattr(ref.model.config, "quantization_config")
        a, b = plain.model.state_dict(), ref.model.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    finally:
        plain.close()
        ref.close()


def test_refuses_an_already_quantized_checkpoint(tmp_path, scales):
    src = tmp_path / "src"
    src.mkdir()
    cfg = json.loads((Path(checkpoint_path(MODEL)) / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(ValueError, match="already declares a quantization_config"):
        fp8_kv.scaled_checkpoint(str(src), str(tmp_path / "out"), scales)
