"""Loader for the golden outputs, used by the conformance suite.

The goldens are produced by ``golden/make_goldens.py`` with Hugging Face transformers
(``attn_implementation="eager"``, CPU, one prompt at a time, greedy decoding with EOS disabled).
For each checkpoint and dtype there is ``golden/outputs/<checkpoint>.<dtype>.safetensors`` with
flat tensors (see README.md for the layout); :func:`load_golden` turns it into Python objects.

Example::

    from golden.load import checkpoint_path, list_checkpoints, load_golden

    for name in list_checkpoints():
        gs = load_golden(name, "float32")
        out = gs.outputs[0]
        out.token_ids        # 32 greedy tokens for gs.prompts[0]
        out.topk[0]          # {token_id: logprob} top-20 at the first generated step
        out.prompt_logprobs  # [None, {tok: lp, ...}, ...] one entry per prompt position
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent
CHECKPOINTS_DIR = GOLDEN_DIR / "checkpoints"
OUTPUTS_DIR = GOLDEN_DIR / "outputs"
MANIFEST_PATH = GOLDEN_DIR / "manifest.json"

DTYPES = ("float32", "bfloat16")
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16"}


@dataclass
class GoldenOutput:
    """Reference results for one prompt.

    Attributes:
        token_ids: greedy generated token ids (EOS does not stop generation).
        topk: per generated step, ``{token_id: logprob}`` of the top-k (k=20) tokens.
        token_logprobs: per generated step, the logprob of the chosen (greedy) token.
        prompt_logprobs: per prompt position; ``None`` at position 0, otherwise the top-k
            plus the actual prompt token (so a dict may hold k or k+1 entries).
    """

    token_ids: list[int]
    topk: list[dict[int, float]]
    token_logprobs: list[float]
    prompt_logprobs: list[dict[int, float] | None]


@dataclass
class GoldenSet:
    """All golden prompts and outputs for one (checkpoint, dtype)."""

    checkpoint: str
    dtype: str
    prompts: list[list[int]]
    outputs: list[GoldenOutput]
    prompt_names: list[str] = field(default_factory=list)
    settings: dict = field(default_factory=dict)


def list_checkpoints() -> list[str]:
    """Names of the golden checkpoints (folders under ``golden/checkpoints``), sorted."""
    if not CHECKPOINTS_DIR.is_dir():
        return []
    return sorted(p.name for p in CHECKPOINTS_DIR.iterdir() if (p / "config.json").is_file())


def checkpoint_path(name: str) -> str:
    """Absolute path of a checkpoint folder, loadable with ``from_pretrained``."""
    path = CHECKPOINTS_DIR / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no golden checkpoint {name!r}; have {list_checkpoints()}")
    return str(path)


def resolve_model(model: str | os.PathLike) -> str:
    """The checkpoint folder ``model`` names: a folder with a config.json as given (relative to the working
    folder), else the golden checkpoint of that name, from any folder. The one resolver behind
    ``nanovllm-ref generate|serve|chat MODEL``, the oracle's adapters and pytest's ``--model`` (``LLM`` takes a
    folder: Python callers resolve a name with this); anything else is a ValueError naming both readings (a folder
    without config.json is returned for the loader to say so)."""
    text = os.fspath(model)
    if os.path.isfile(os.path.join(text, "config.json")):
        return text
    if (CHECKPOINTS_DIR / text / "config.json").is_file() and text == os.path.basename(text):
        return str(CHECKPOINTS_DIR / text)
    if os.path.isdir(text):
        return text
    raise ValueError(f"model {text!r} does not exist: it is neither a checkpoint folder nor a golden checkpoint "
                     f"name ({', '.join(list_checkpoints())})")


def golden_name(path: str | os.PathLike) -> str | None:
    """The golden checkpoint's name if ``path`` is one of the golden checkpoint folders, else None."""
    folder = Path(path).resolve()
    return folder.name if folder.parent == CHECKPOINTS_DIR.resolve() and folder.name in list_checkpoints() else None


def normalize_dtype(dtype: object) -> str:
    """Map ``"bf16"``, ``torch.bfloat16``, ``"float32"``... to ``"float32"`` or ``"bfloat16"``."""
    text = str(dtype).removeprefix("torch.")
    text = _DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise ValueError(f"unsupported golden dtype {dtype!r}; use one of {DTYPES}")
    return text


def output_paths(name: str, dtype: str) -> tuple[Path, Path]:
    """Paths of the (tensor file, settings JSON) for a checkpoint and dtype."""
    stem = f"{name}.{normalize_dtype(dtype)}"
    return OUTPUTS_DIR / f"{stem}.safetensors", OUTPUTS_DIR / f"{stem}.json"


def _topk_dict(ids: list[int], lps: list[float]) -> dict[int, float]:
    return {int(i): float(v) for i, v in zip(ids, lps) if i >= 0}


def load_golden(checkpoint_name: str, dtype: str) -> GoldenSet:
    """Load the golden set of ``checkpoint_name`` for ``dtype`` (``"float32"`` or ``"bfloat16"``)."""
    from safetensors.numpy import load_file

    tensor_path, settings_path = output_paths(checkpoint_name, dtype)
    if not tensor_path.is_file():
        raise FileNotFoundError(f"missing golden file {tensor_path}")
    t = load_file(str(tensor_path))
    settings = json.loads(settings_path.read_text()) if settings_path.is_file() else {}

    offsets = t["prompt_offsets"].tolist()
    flat_ids = t["prompt_token_ids"].tolist()
    p_tok_lp = t["prompt_token_logprobs"].tolist()
    p_top_ids = t["prompt_topk_ids"].tolist()
    p_top_lp = t["prompt_topk_logprobs"].tolist()
    out_ids = t["output_token_ids"].tolist()
    out_lp = t["output_token_logprobs"].tolist()
    out_top_ids = t["output_topk_ids"].tolist()
    out_top_lp = t["output_topk_logprobs"].tolist()

    prompts: list[list[int]] = []
    outputs: list[GoldenOutput] = []
    for p, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
        prompts.append(flat_ids[start:end])
        prompt_lps: list[dict[int, float] | None] = [None]
        for pos in range(start + 1, end):
            d = _topk_dict(p_top_ids[pos], p_top_lp[pos])
            if not math.isnan(p_tok_lp[pos]):
                d[flat_ids[pos]] = float(p_tok_lp[pos])
            prompt_lps.append(d)
        outputs.append(
            GoldenOutput(
                token_ids=[int(x) for x in out_ids[p]],
                topk=[_topk_dict(i, v) for i, v in zip(out_top_ids[p], out_top_lp[p])],
                token_logprobs=[float(x) for x in out_lp[p]],
                prompt_logprobs=prompt_lps,
            )
        )
    names = [m["name"] for m in settings.get("prompts", [])]
    return GoldenSet(
        checkpoint=checkpoint_name,
        dtype=normalize_dtype(dtype),
        prompts=prompts,
        outputs=outputs,
        prompt_names=names,
        settings=settings,
    )
