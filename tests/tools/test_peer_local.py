"""tools/peer_local.py without a peer engine: the planted conversion bugs change exactly what they claim in a copy
of the golden checkpoint, and refuse a checkpoint they cannot be planted in (so a planted row never runs the
original by mistake)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from golden.load import checkpoint_path
from tools.peer_local import PLANTED, PLANTED_IN, plant


def _read(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    return json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_each_planted_bug_changes_only_its_part(bug, tmp_path):
    original = Path(checkpoint_path(PLANTED_IN[bug]))
    (cfg, tensors), (new_cfg, new) = _read(original), _read(plant(bug, PLANTED_IN[bug], tmp_path / bug))
    changed = sorted(k for k in new if k not in tensors or not torch.equal(new[k], tensors[k]))
    if bug == "drop_bias":
        assert changed == sorted(k for k in tensors if k.endswith(".bias")) and changed
        assert all(not new[k].any() for k in changed) and new_cfg == cfg
    elif bug == "rope_theta":
        assert not changed and new_cfg["rope_theta"] == 10000.0 != cfg["rope_theta"]
    else:
        assert changed == ["lm_head.weight"] and new_cfg["tie_word_embeddings"] is False
        assert new["lm_head.weight"].shape == tensors["model.embed_tokens.weight"].shape


def test_a_bug_that_cannot_be_planted_is_refused(tmp_path):
    with pytest.raises(ValueError, match="has no bias to drop"):
        plant("drop_bias", "qwen3-tiny", tmp_path / "x")
    with pytest.raises(ValueError, match="untied embeddings already"):
        plant("untied", "qwen3-gqa4", tmp_path / "y")
