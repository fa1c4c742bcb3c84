"""Does an engine compute a golden checkpoint *without its attention output bias*? The evidence behind the vLLM
rows of conformance/README.md ("Peers"): vLLM 0.32's Qwen3 and Qwen3-MoE build ``o_proj`` with ``bias=False``
and drop the checkpoint's ``o_proj.bias`` tensors (qwen3-bias-hd32, qwen3-moe-unnorm-hd32).

Three steps, each in the venv that has what it needs (files under ``--out``):

    python -m tools.probe_dropped_bias reference --model qwen3-moe-unnorm-hd32 --out DIR   # venv with transformers
    python -m tools.probe_dropped_bias engine --model qwen3-moe-unnorm-hd32 --out DIR      # venv with vLLM
    python -m tools.probe_dropped_bias compare --model qwen3-moe-unnorm-hd32 --out DIR

``reference`` writes a copy of the checkpoint whose ``*.o_proj.bias`` tensors are zero and runs transformers
(the goldens' arithmetic, :class:`~nanovllm_ref.oracle.adapters.HFAdapter`) on it over the golden prompts;
``engine`` runs the engine (``--engine``, default vllm) on the *original* checkpoint; ``compare`` applies the
conformance policy to engine vs goldens and engine vs the bias-free reference, with the golden tolerance. An
engine that drops the bias fails the first and matches the second to float noise.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

TOP_K, MAX_TOKENS = 20, 32


def _save(outputs: list, path: Path) -> None:
    rows = [{"token_ids": o.token_ids, "topk": [{str(t): v for t, v in d.items()} for d in o.topk],
             "prompt_logprobs": [None if d is None else {str(t): v for t, v in d.items()}
                                 for d in (o.prompt_logprobs or [])]} for o in outputs]
    path.write_text(json.dumps(rows))


def _load(path: Path) -> list:
    from nanovllm_ref.oracle.compare import EngineOutput

    def ints(d: dict | None) -> dict | None:
        return None if d is None else {int(t): float(v) for t, v in d.items()}

    return [EngineOutput(r["token_ids"], [ints(d) for d in r["topk"]], [ints(d) for d in r["prompt_logprobs"]])
            for r in json.loads(path.read_text())]


def without_o_proj_bias(src: Path, dst: Path) -> int:
    """Copy checkpoint ``src`` to ``dst`` with every ``o_proj.bias`` zeroed; returns how many were zeroed."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, dirs_exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    zeroed = [k for k in tensors if k.endswith("o_proj.bias")]
    for k in zeroed:
        tensors[k] = tensors[k].clone().zero_()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return len(zeroed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("reference", "engine", "compare"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from golden.load import checkpoint_path, load_golden

    golden = load_golden(args.model, args.dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{args.model}.{args.dtype}"
    if args.step == "reference":
        from nanovllm_ref.oracle.adapters import HFAdapter

        copy = args.out / f"{args.model}-no-o_proj-bias"
        print(f"zeroed {without_o_proj_bias(Path(checkpoint_path(args.model)), copy)} o_proj.bias tensors in {copy}")
        _save(HFAdapter(str(copy), args.dtype).generate(golden.prompts, MAX_TOKENS, TOP_K, True),
              Path(f"{stem}.reference-no-bias.json"))
    elif args.step == "engine":
        from nanovllm_ref.oracle.adapters import load_adapter

        engine = load_adapter(args.engine, checkpoint_path(args.model), args.dtype)
        try:
            _save(engine.generate(golden.prompts, MAX_TOKENS, TOP_K, True), Path(f"{stem}.{args.engine}.json"))
        finally:
            engine.close()
    else:
        from nanovllm_ref.oracle.compare import compare_all
        from nanovllm_ref.oracle.tolerances import golden_tolerance

        tol = golden_tolerance(args.dtype, checkpoint=args.model)
        cand = _load(Path(f"{stem}.{args.engine}.json"))
        for label, ref in (("goldens", golden.outputs), ("transformers without o_proj.bias",
                                                         _load(Path(f"{stem}.reference-no-bias.json")))):
            rep = compare_all(ref, cand, top_k=TOP_K, tol=tol.tol, prompt_tol=tol.prompt_tol,
                              prompt_ids=golden.prompt_names, prompts=golden.prompts)
            worst = max(p.max_abs_diff for p in rep.prompts)
            counts = {s: sum(p.status == s for p in rep.prompts) for s in {p.status for p in rep.prompts}}
            print(f"{args.engine} ({args.model}, {args.dtype}) vs {label}: {counts}, max |dlogprob| {worst:.3g} "
                  f"(tol {tol.tol:.3g} / prompt {tol.prompt_tol:.3g})")


if __name__ == "__main__":  # vLLM spawns workers that re-import this module
    main()
