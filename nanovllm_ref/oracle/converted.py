"""What the adapters of engines that run their own model format share (llama.cpp's GGUF, CTranslate2's model.bin,
ONNX Runtime GenAI's ONNX): converting a Hugging Face checkpoint once into a cache, and turning full log-prob
rows into the suite's ``{token_id: logprob}`` dicts.

A converted model is kept under ``$NANOVLLM_REF_CACHE/converted`` (default ``~/.cache/nanovllm_ref/converted``),
in a folder named by the engine, the format and a digest of the checkpoint (its config.json and its files' sizes
and modification times), so a changed checkpoint is converted again. A conversion is written to a temporary
folder and renamed into place, so an interrupted one never passes for a finished one.

The conversions run the engine's own converter in a subprocess (``sys.executable``: the venv that has the engine),
with the converter's output kept beside the model (``convert.log``) for triage.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .compare import EngineOutput


def checked_engine(engine: str, module: str, pip: str, model_path: str, dtype: str, quantization: str | None, *,
                   quantizations: Mapping[str | None, str], architectures: Sequence[str], dtype_why: str,
                   converter: str) -> Any:
    """The engine's package, once the request passes what every converting adapter checks before it converts
    anything: the package imports (else an ImportError naming ``--engine`` and the ``pip`` line), ``dtype`` is
    float32 (``dtype_why``: how this engine's precisions are chosen instead), ``quantization`` is one of
    ``quantizations``' keys (None: float32), and ``converter`` (the engine's converter, by name) takes the
    checkpoint's architecture; each refusal names its field."""
    try:
        package = importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"--engine {engine} needs the '{pip.split()[0]}' package ({e}); pip install {pip}") from e
    if dtype != "float32":
        raise ValueError(f"dtype {dtype!r}: {dtype_why}")
    if quantization not in quantizations:
        raise ValueError(f"quantization {quantization!r}: use one of {[q for q in quantizations if q]} or none")
    arch = read_config(model_path)["architectures"][0]
    if arch not in architectures:
        raise ValueError(f"{converter} has no {arch}; it takes {tuple(architectures)}")
    return package


def cache_root() -> Path:
    return Path(os.environ.get("NANOVLLM_REF_CACHE") or Path.home() / ".cache" / "nanovllm_ref") / "converted"


def checkpoint_digest(checkpoint: str | os.PathLike) -> str:
    """A digest of a checkpoint folder: config.json's content and every file's name, size and mtime."""
    src = Path(checkpoint).resolve()
    h = hashlib.sha256((src / "config.json").read_bytes())
    for f in sorted(src.iterdir()):
        st = f.stat()  # follows links: a dialect view's weights are its checkpoint's
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def convert_once(engine: str, fmt: str, checkpoint: str | os.PathLike, build: Callable[[Path, Path], None],
                 marker: str) -> Path:
    """The folder of ``checkpoint`` converted to ``fmt`` for ``engine``; ``build(src, tmp_dir)`` makes it when it is
    not cached (``marker``: a file that exists in a finished conversion)."""
    src = Path(checkpoint).resolve()
    dst = cache_root() / engine / f"{src.name}-{fmt}-{checkpoint_digest(src)}"
    if (dst / marker).exists():
        return dst
    tmp = dst.with_name(f"{dst.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        build(src, tmp)
        if not (tmp / marker).exists():
            raise RuntimeError(f"{engine}: converting {src} to {fmt} made no {marker} (see {tmp / 'convert.log'})")
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    except BaseException:
        log = tmp / "convert.log"
        if log.is_file():  # keep the converter's words for the error, drop the half-made model
            keep = dst.with_name(dst.name + ".failed.log")
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, keep)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def run_converter(cmd: Sequence[str], out_dir: Path, env: dict[str, str] | None = None,
                  timeout_s: float = 1800) -> None:
    """Run a converter command; its output goes to ``out_dir/convert.log``; a failure raises with the log's tail."""
    log = out_dir / "convert.log"
    with log.open("w") as f:
        f.write("$ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        proc = subprocess.run(list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT,
                              env={**os.environ, **(env or {})}, timeout=timeout_s)
    if proc.returncode != 0:
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"converter exited with {proc.returncode}: {' '.join(map(str, cmd[:4]))} ...\n{tail}")


def topk_dict(logprobs: Any, k: int) -> dict[int, float]:
    """``{token: logprob}`` of the k largest entries of a 1-D float row (numpy or torch), in descending order,
    ties broken by the lowest id (as the goldens break them)."""
    import numpy as np

    row = np.asarray(logprobs, dtype=np.float64)
    order = np.lexsort((np.arange(row.size), -row))[:k]  # by value descending, then by id
    return {int(t): float(row[t]) for t in order}


def log_softmax(logits: Any) -> Any:
    """Row-wise log-softmax in float64 of a numpy array (the engines return float32 logits)."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def prompt_logprob_dicts(rows: Any, prompt: Sequence[int], k: int) -> list[dict[int, float] | None]:
    """``[None, {top-k + prompt[1]}, ...]`` from ``rows[i]`` = the log-probs predicted after ``prompt[: i + 1]``."""
    out: list[dict[int, float] | None] = [None]
    for pos in range(1, len(prompt)):
        d = topk_dict(rows[pos - 1], k)
        d[int(prompt[pos])] = float(rows[pos - 1][prompt[pos]])
        out.append(d)
    return out


def greedy_output(step_rows: Sequence[Any], tokens: Sequence[int], k: int,
                  prompt_rows: Any = None, prompt: Sequence[int] | None = None) -> EngineOutput:
    """An :class:`EngineOutput` from the engine's tokens and the log-prob row of every step (the chosen token is
    added to its step's dict when it falls outside the top-k)."""
    topk = []
    for row, tok in zip(step_rows, tokens):
        d = topk_dict(row, k)
        d.setdefault(int(tok), float(row[tok]))
        topk.append(d)
    prompt_lps = None if prompt_rows is None else prompt_logprob_dicts(prompt_rows, prompt or [], k)
    return EngineOutput([int(t) for t in tokens], topk, prompt_lps)


def read_config(checkpoint: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / "config.json").read_text())
