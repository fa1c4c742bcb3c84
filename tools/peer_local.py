"""llama.cpp, CTranslate2 and ONNX Runtime GenAI as real peers (`nox -s peer-llamacpp|peer-ctranslate2|peer-ortgenai`).

For one engine: test_golden through ``--engine NAME`` on every golden checkpoint its converter supports, in float32
(in both config dialects: ``CKPT`` and ``CKPT@rope_scaling``, oracle/dialects.py) and in each quantization it
ships (against the float32 goldens under that quantization's tier, tolerances.QUANT_TIERS); llama.cpp also through
its OpenAI-compatible server (``python -m llama_cpp.server``, ``--engine llamacpp:URL``). Then the planted conversion
bugs (PLANTED below) in every precision, each of which must FAIL. Prints the markdown table and writes
it to ``OUT/results.md``, with each run's JSON report and log beside it, and ``OUT/tiers.json``: per precision the
largest per-position and set-mean |dlogprob| of the correct conversions (what the tiers are derived from). Exit 1 if
a row failed for a reason not traced to the engine (KNOWN_BUGS) or a planted bug passed.

    python -m tools.peer_local --engine ctranslate2 [--models a,b] [--quantizations none,int8] [--no-planted]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tools.peer_common import all_passed, markdown, pytest_conformance, rows_of, server_rows


@dataclass(frozen=True)
class PeerEngine:
    name: str  # --engine
    package: str  # what reports the version
    module: str  # the adapter module (ARCHITECTURES, QUANTIZATIONS-like table)
    precisions: tuple[str | None, ...]  # None: float32
    tier_prefix: str
    known: dict[str, str] = field(default_factory=dict)  # checkpoint -> the engine / converter bug it shows
    server: bool = False
    planted_in: dict[str, str] = field(default_factory=dict)  # bug -> checkpoint, where PLANTED_IN's is refused


ENGINES = {
    "llamacpp": PeerEngine(
        "llamacpp", "llama_cpp", "nanovllm_ref.oracle.llamacpp_adapter", (None, "bf16", "q8_0"), "gguf", known={
            "qwen3-bias-hd32": "llama.cpp's Qwen3 has no o_proj bias: the converter writes blk.N.attn_output.bias and "
                               "the loader refuses the file (wrong number of tensors; expected 33, got 31)",
            "qwen3-moe-unnorm-hd32": "llama.cpp's Qwen3-MoE has no o_proj bias: the loader refuses the converted file",
            "qwen3-moe-tiny": "llama.cpp's converter cannot map a Qwen3-MoE dense layer (mlp_only_layers [1]): "
                              "'Can not map tensor model.layers.1.mlp.down_proj.weight'",
            "qwen3-words-hd32": "llama.cpp's converter writes the WordLevel tokenizer as a BPE vocabulary without "
                                "merges (a warning only) and the loader refuses the file: 'cannot find tokenizer "
                                "merges in model file'",
        }, server=True, planted_in={"drop_bias": "llama3-bias-hd32"}),  # it refuses qwen3-bias-hd32 itself
    "ctranslate2": PeerEngine(
        "ctranslate2", "ctranslate2", "nanovllm_ref.oracle.ctranslate2_adapter", (None, "int8"), "ct2", known={
            "llama3-tiny": "CTranslate2 4.8.5's LlamaLoader never passes rope_scaling.original_max_position_embeddings,"
                           " and its runtime then runs llama3 RoPE scaling as no scaling at all",
            "llama3-bias-hd32": "CTranslate2 4.8.5's LlamaLoader ignores config.head_dim (32) and builds "
                                "hidden_size / num_heads (16): 'axis 2 has dimension 384 but expected 192'",
        }),
    "ortgenai": PeerEngine(
        "ortgenai", "onnxruntime_genai", "nanovllm_ref.oracle.ortgenai_adapter", (None, "int4"), "ort", known={
            "mistral-tiny": "ONNX Runtime GenAI 0.18.0's builder exports head_dim 24, which its CPU "
                            "GroupQueryAttention refuses ('head_size shall be a multiple of 16')",
        }),
}


def supported_checkpoints(module: str) -> list[str]:
    """The golden checkpoints whose architecture the engine's converter handles."""
    import importlib

    from golden.load import checkpoint_path, list_checkpoints

    archs = importlib.import_module(module).ARCHITECTURES
    return [n for n in list_checkpoints()
            if json.loads((Path(checkpoint_path(n)) / "config.json").read_text())["architectures"][0] in archs]


def suite_rows(eng: PeerEngine, label: str, models: list[str], precision: str | None, out: Path,
               run_s: float) -> list[dict]:
    """test_golden in one pytest session for one precision (float32: both config dialects)."""
    tag = precision or "float32"
    names = models + ([f"{m}@rope_scaling" for m in models] if precision is None else [])
    report, log = out / f"in-process-{tag}.json", out / f"in-process-{tag}.log"
    args = [f"quantization={precision}"] if precision else []
    pytest_conformance(eng.name, names, ["float32"], report, log, run_s * len(names), args, tag="peer_local")
    shown = "float32" if precision is None else f"{precision} (vs float32 goldens, tier {eng.tier_prefix}-{precision})"
    return rows_of(report, label, f"in-process (`--engine {eng.name}`)", names, ["float32"], log, eng.known, shown)


# Conversion bugs planted in a copy of a golden checkpoint, to show that a quantization tier still catches what a
# broken converter produces (tolerances.QUANT_TIERS): the engine converts and runs the planted copy, which is
# compared with the *original* checkpoint's float32 goldens under the tier, and must fail. drop_bias: every bias
# tensor zeroed (a converter that drops attention_bias / o_proj.bias, as vLLM's Qwen3 did), on a checkpoint with
# biases; rope_theta: rope_theta 10000 in config.json, both dialects (a converter that falls back to the default);
# untied: tie_word_embeddings false and a freshly initialised lm_head.weight (normal, std 0.02, what transformers
# gives a missing weight), on a tied checkpoint (a converter that does not tie the output layer).
WEIGHTS = "model.safetensors"


def _copy(src: Path, dst: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return json.loads((dst / "config.json").read_text()), load_file(str(dst / WEIGHTS))


def _save(dst: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / WEIGHTS), metadata={"format": "pt"})


def drop_bias(src: Path, dst: Path) -> None:
    config, tensors = _copy(src, dst)
    biases = [k for k in tensors if k.endswith(".bias")]
    if not biases:
        raise ValueError(f"{src.name} has no bias to drop")
    for k in biases:
        tensors[k] = torch.zeros_like(tensors[k])
    _save(dst, config, tensors)


def rope_theta(src: Path, dst: Path, theta: float = 10000.0) -> None:
    config, tensors = _copy(src, dst)
    if config.get("rope_theta") == theta:
        raise ValueError(f"{src.name} already has rope_theta {theta:g}")
    config["rope_theta"] = theta
    if isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"]["rope_theta"] = theta
    _save(dst, config, tensors)


def untied(src: Path, dst: Path) -> None:
    config, tensors = _copy(src, dst)
    if not config.get("tie_word_embeddings"):
        raise ValueError(f"{src.name} has untied embeddings already")
    embed = tensors["model.embed_tokens.weight"]
    config["tie_word_embeddings"] = False
    tensors["lm_head.weight"] = torch.randn(embed.shape, generator=torch.Generator().manual_seed(0)) * 0.02
    _save(dst, config, tensors)


PLANTED: dict[str, Callable[[Path, Path], None]] = {"drop_bias": drop_bias, "rope_theta": rope_theta,
                                                    "untied": untied}
# the golden checkpoint each is planted in (every engine here runs these architectures)
PLANTED_IN = {"drop_bias": "qwen3-bias-hd32", "rope_theta": "qwen2-tiny", "untied": "qwen3-tied-hd64"}


def plant(bug: str, checkpoint: str, out_dir: str | Path) -> Path:
    """``out_dir`` holding ``checkpoint`` (a golden name) with ``bug`` planted."""
    from golden.load import checkpoint_path

    dst = Path(out_dir)
    PLANTED[bug](Path(checkpoint_path(checkpoint)), dst)
    return dst


def planted_rows(eng: PeerEngine, label: str, precision: str | None, out: Path) -> list[dict]:
    """Each planted conversion bug, converted and run by the engine, compared with the original's goldens under
    the precision's tolerance: a pass here is a miss of the oracle."""
    from nanovllm_ref.oracle.adapters import load_adapter
    from nanovllm_ref.oracle.references import golden_reference, run_check
    from nanovllm_ref.oracle.tolerances import golden_tolerance, quantized_tolerance

    rows = []
    for bug, checkpoint in {**PLANTED_IN, **eng.planted_in}.items():
        kwargs = {"quantization": precision} if precision else {}
        tol = quantized_tolerance(f"{eng.tier_prefix}-{precision}", "float32", checkpoint) if precision else \
            golden_tolerance("float32", checkpoint=checkpoint)
        row = {"engine": label, "checkpoint": f"{checkpoint} + planted {bug}",
               "dtype": precision or "float32", "route": "in-process, planted conversion bug"}
        try:
            adapter = load_adapter(eng.name, str(plant(bug, checkpoint, out / f"planted-{bug}")), "float32", **kwargs)
            try:
                report = run_check(adapter, golden_reference(checkpoint, "float32"), tol, case=f"planted-{bug}")
            finally:
                adapter.close()
        except Exception as e:  # noqa: BLE001 - a converter refusing the planted copy is a catch too
            rows.append({**row, "verdict": f"caught (the engine refused it: {str(e).splitlines()[0][:120]})",
                         "max_diff": "-", "mean_diff": "-"})
            continue
        failed = sum(p.status == "fail" for p in report.prompts)
        count = sum(p.gen_diff_count for p in report.prompts)
        mean = sum(p.gen_diff_sum for p in report.prompts) / count if count else 0.0
        verdict = (f"caught (FAIL: {failed}/{len(report.prompts)} prompts failed"
                   + (", set mean over mean_tol" if report.set_failures else "") + ")") if not report.passed \
            else "MISSED: passed the tier"
        rows.append({**row, "verdict": verdict, "max_diff": f"{max(p.max_abs_diff for p in report.prompts):.3g}",
                     "mean_diff": f"{mean:.3g}"})
    return rows


def measured(out: Path, precisions: tuple[str | None, ...], known: dict[str, str]) -> dict:
    """Per precision and golden checkpoint (known-bug checkpoints left out), from the JSON reports: the largest
    generated-step and prompt |dlogprob| of any prompt and the set's mean, as nanovllm_ref/oracle/quant_tiers.py
    records them: ``{precision: {checkpoint: [gen max, prompt max, set mean]}}``."""
    tiers: dict[str, dict] = {}
    for precision in precisions:
        report = out / f"in-process-{precision or 'float32'}.json"
        if not report.is_file():
            continue
        by_model: dict[str, list] = {}
        for p in json.loads(report.read_text()).get("prompts", []):
            if p["model"].partition("@")[0] not in known:
                by_model.setdefault(p["model"], []).append(p)
        tiers[precision or "float32"] = {
            m: [round(max(p["max_gen_diff"] for p in ps), 4), round(max(p["max_prompt_diff"] for p in ps), 4),
                round(sum(p["gen_diff_sum"] for p in ps) / max(1, sum(p["gen_diff_count"] for p in ps)), 4)]
            for m, ps in sorted(by_model.items())}
    return tiers


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", required=True, choices=sorted(ENGINES))
    p.add_argument("--models", default="", help="comma-separated golden checkpoints (default: all it converts)")
    p.add_argument("--quantizations", default="", help="comma-separated, 'none' = float32 (default: all it ships)")
    p.add_argument("--no-planted", action="store_true", help="skip the planted conversion bugs")
    p.add_argument("--no-suite", action="store_true", help="only the planted conversion bugs (and the server)")
    p.add_argument("--no-server", action="store_true", help="skip the server route (llama.cpp)")
    p.add_argument("--out", default="")
    p.add_argument("--run-s", type=float, default=600.0, help="time limit per checkpoint of a pytest run")
    args = p.parse_args(argv)
    import importlib

    eng = ENGINES[args.engine]
    label = f"{eng.name} {importlib.import_module(eng.package).__version__}"
    models = [m for m in args.models.split(",") if m] or supported_checkpoints(eng.module)
    wanted = [None if q == "none" else q for q in args.quantizations.split(",") if q]
    precisions = tuple(q for q in eng.precisions if not wanted or q in wanted)
    out = Path(args.out or f"peer-{eng.name}-results").resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for precision in () if args.no_suite else precisions:
        rows += suite_rows(eng, label, models, precision, out, args.run_s)
        (out / "results.md").write_text(markdown(rows))
    if eng.server and not args.no_server:
        rows += server_rows(label, models, out, args.run_s, eng.known)
    if not args.no_planted:
        for precision in precisions:
            rows += planted_rows(eng, label, precision, out)
            (out / "results.md").write_text(markdown(rows))
    (out / "tiers.json").write_text(json.dumps(measured(out, precisions, eng.known), indent=2) + "\n")
    table = markdown(rows)
    (out / "results.md").write_text(table)
    print(table)
    print(f"measured per precision (tolerances.QUANT_TIERS): {out / 'tiers.json'}")
    return 0 if all_passed(rows) and not any(r["verdict"].startswith("MISSED") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
