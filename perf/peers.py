"""Peers on the same workload and device: transformers (continuous batching, static generate), vLLM, SGLang.

    python3 -m perf.peers --arch qwen3-0.6b --workload headline --peer all          # each in a subprocess
    python3 -m perf.peers --peer hf-cb --peer-requests 64                            # a time-bounded subset
    python3 -m perf.peers --peer hf-cb --cuda-graph                                  # HF CB with use_cuda_graph

- `hf-cb`: transformers' continuous batching (`model.init_continuous_batching(...)`, a background thread;
  `manager.add_request(ids, max_new_tokens=n, eos_token_id=-1)` per request: per-request lengths, greedy,
  EOS disabled), default ContinuousBatchingConfig unless `--cuda-graph`. Same API in transformers 5.17-5.24.
  On the H200 the full headline workload takes ~200 s (654 tok/s measured): `--peer-requests N` runs the
  first N requests and the output says so.
- `hf-static`: `model.generate` of 64 left-padded prompts (the workload's first 64) x 256 new tokens, greedy.
- `vllm`, `sglang`: their offline engines with random weights (`load_format="dummy"`), token-id prompts,
  `ignore_eos`, the workload's temperature; skipped (status "skipped") when not importable.
Throughput = output tokens / wall time of the timed call, after a warm-up, as for nanovllm_ref.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from nanovllm_ref.testing.bench import workloads
from nanovllm_ref.testing.bench.device import device_type, machine_info, sync
from nanovllm_ref.testing.bench.models import model_folder
from nanovllm_ref.testing.bench.tables import save_result, text_table

PEERS = ("hf-cb", "hf-static", "vllm", "sglang")


def _hf_model(folder: str, dummy: bool, device: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if dummy:
        cfg = AutoConfig.from_pretrained(folder)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
    return model.eval()


def _cb_run(manager: Any, prompts: list[list[int]], lens: list[int], timeout_s: float) -> tuple[int, int]:
    """Add the requests, wait for all; returns (finished requests, generated tokens)."""
    for i, (p, n) in enumerate(zip(prompts, lens)):
        manager.add_request(p, request_id=f"r{time.monotonic_ns()}_{i}", max_new_tokens=n, eos_token_id=-1)
    done, tokens, deadline = 0, 0, time.monotonic() + timeout_s
    while done < len(prompts):
        result = manager.get_result(timeout=1)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' continuous batching thread stopped")
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {done}/{len(prompts)} requests finished in {timeout_s:.0f} s")
            continue
        if result.is_finished():
            if getattr(result, "error", None):
                raise RuntimeError(f"request {result.request_id} failed: {result.error}")
            done += 1
            tokens += len(result.generated_tokens)
    return done, tokens


def run_hf_cb(folder: str, dummy: bool, w: workloads.Workload, device: str, cuda_graph: bool,
              timeout_s: float) -> dict[str, Any]:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    model = _hf_model(folder, dummy, device)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(w.output_lens), eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(use_cuda_graph=True) if cuda_graph else None
    # no inference_mode here: the manager's cache would become inference tensors that its worker thread
    # (outside inference mode) cannot update in place (RuntimeError on transformers 5.17)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    if hasattr(manager, "warmup") and device == "cuda":
        manager.warmup()
    manager.start()
    try:
        _cb_run(manager, [[5] * 16, [6] * 200, [7] * 700], [8, 8, 8], timeout_s)  # warm-up
        attn = getattr(model.config, "_attn_implementation", None)  # CB switches it (e.g. "paged|sdpa")
        sync(device)
        t0 = time.perf_counter()
        _, tokens = _cb_run(manager, w.prompts, w.output_lens, timeout_s)
        sync(device)
        wall = time.perf_counter() - t0
    finally:
        manager.stop(block=True, timeout=30)
    return {"wall_s": wall, "output_tokens": tokens, "prompt_tokens": w.prompt_tokens, "attn_implementation": attn,
            "use_cuda_graph": cuda_graph}


def run_hf_static(folder: str, dummy: bool, w: workloads.Workload, device: str, batch: int,
                  new_tokens: int) -> dict[str, Any]:
    from transformers import GenerationConfig

    model = _hf_model(folder, dummy, device)
    prompts = w.prompts[:batch]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    gen = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:, -32:], attention_mask=mask[:, -32:], generation_config=GenerationConfig(
            do_sample=False, max_new_tokens=4, min_new_tokens=4, eos_token_id=None, pad_token_id=0))  # warm-up
        sync(device)
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, generation_config=gen)
        sync(device)
        wall = time.perf_counter() - t0
    tokens = (out.shape[1] - width) * out.shape[0]
    return {"wall_s": wall, "output_tokens": tokens, "prompt_tokens": sum(len(p) for p in prompts),
            "batch": len(prompts), "new_tokens": new_tokens, "workload_note": f"{len(prompts)} left-padded prompts"}


def run_vllm(folder: str, dummy: bool, w: workloads.Workload, tp: int, max_model_len: int) -> dict[str, Any]:
    from vllm import LLM as VLLM
    from vllm import SamplingParams as VParams

    kw: dict[str, Any] = dict(model=folder, skip_tokenizer_init=True, max_model_len=max_model_len,
                              tensor_parallel_size=tp)
    if dummy:
        kw["load_format"] = "dummy"
    llm = VLLM(**kw)

    def params(n: int, t: float) -> Any:
        try:
            return VParams(temperature=t, max_tokens=n, ignore_eos=True, detokenize=False)
        except TypeError:
            return VParams(temperature=t, max_tokens=n, ignore_eos=True)

    llm.generate([{"prompt_token_ids": [1, 2, 3]}], params(8, 0.6), use_tqdm=False)
    prompts = [{"prompt_token_ids": p} for p in w.prompts]
    sps = [params(n, w.temperature) for n in w.output_lens]
    sync("cuda")
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sps, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    import vllm

    return {"wall_s": wall, "output_tokens": tokens, "prompt_tokens": w.prompt_tokens, "version": vllm.__version__}


def run_sglang(folder: str, dummy: bool, w: workloads.Workload, tp: int, max_model_len: int) -> dict[str, Any]:
    import sglang as sgl

    kw: dict[str, Any] = dict(model_path=folder, skip_tokenizer_init=True, context_length=max_model_len, tp_size=tp)
    if dummy:
        kw["load_format"] = "dummy"
    engine = sgl.Engine(**kw)
    try:
        engine.generate(input_ids=[[1, 2, 3]], sampling_params={"max_new_tokens": 8, "ignore_eos": True})
        sps = [{"temperature": w.temperature, "max_new_tokens": n, "ignore_eos": True} for n in w.output_lens]
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=w.prompts, sampling_params=sps)
        wall = time.perf_counter() - t0
    finally:
        engine.shutdown()
    tokens = sum(len(o.get("output_ids") or []) or o.get("meta_info", {}).get("completion_tokens", 0) for o in outs)
    return {"wall_s": wall, "output_tokens": tokens, "prompt_tokens": w.prompt_tokens, "version": sgl.__version__}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m perf.peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer", default="all", help=f"one of {PEERS} or 'all' (each in its own process)")
    p.add_argument("--arch", default="qwen3-0.6b")
    p.add_argument("--model", default=None, help="a real checkpoint folder (overrides --arch)")
    p.add_argument("--workload", default="headline")
    p.add_argument("--peer-requests", type=int, default=None, help="run only the first N requests (time bound)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--tp", type=int, default=1, help="vLLM / SGLang tensor parallel size")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--cuda-graph", action="store_true", help="hf-cb: ContinuousBatchingConfig(use_cuda_graph=True)")
    p.add_argument("--static-batch", type=int, default=64)
    p.add_argument("--static-new-tokens", type=int, default=256)
    p.add_argument("--timeout", type=float, default=1800.0, help="hf-cb: give up after this many seconds")
    p.add_argument("--json", default=None)
    p.add_argument("--no-save", action="store_true")
    return p.parse_args(argv)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device or device_type()
    folder, dummy = model_folder(args.arch, args.model), args.model is None
    w = workloads.get(args.workload)
    if args.peer_requests:
        w = w.subset(args.peer_requests)
    if args.temperature is not None:
        w = w.with_temperature(args.temperature)
    record: dict[str, Any] = {"kind": "peer", "engine": args.peer, "arch": args.arch, "model": args.model,
                              "tp": args.tp, "device": device, "workload": w.summary(), "machine": machine_info()}
    try:
        if args.peer == "hf-cb":
            res = run_hf_cb(folder, dummy, w, device, args.cuda_graph, args.timeout)
            if args.cuda_graph:
                record["engine"] = "hf-cb-cudagraph"
        elif args.peer == "hf-static":
            res = run_hf_static(folder, dummy, w, device, args.static_batch, args.static_new_tokens)
        elif args.peer == "vllm":
            res = run_vllm(folder, dummy, w, args.tp, args.max_model_len)
        elif args.peer == "sglang":
            res = run_sglang(folder, dummy, w, args.tp, args.max_model_len)
        else:
            raise ValueError(f"unknown peer {args.peer!r}; known: {PEERS}")
    except ImportError as e:
        record.update(status="skipped", error=f"{type(e).__name__}: {e}")
        return record
    except Exception as e:  # a peer failing must not hide the others' numbers
        record.update(status="error", error=f"{type(e).__name__}: {e}")
        return record
    res["output_tok_s"] = res["output_tokens"] / res["wall_s"]
    res["total_tok_s"] = (res["output_tokens"] + res["prompt_tokens"]) / res["wall_s"]
    record.update(status="ok", **res)
    return record


def _child_argv(args: argparse.Namespace, peer: str, out: str) -> list[str]:
    argv = [sys.executable, "-m", "perf.peers", "--peer", peer, "--json", out, "--arch", args.arch,
            "--workload", args.workload, "--tp", str(args.tp), "--max-model-len", str(args.max_model_len),
            "--static-batch", str(args.static_batch), "--static-new-tokens", str(args.static_new_tokens),
            "--timeout", str(args.timeout)]
    for flag, value in (("--model", args.model), ("--peer-requests", args.peer_requests),
                        ("--temperature", args.temperature), ("--device", args.device)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--cuda-graph"] if args.cuda_graph else [])


def _run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each peer in a fresh process, so one's GPU memory is gone before the next starts."""
    records = []
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for peer in PEERS:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "r.json")
            cmd = _child_argv(args, peer, out)
            print(f"== {peer}: {' '.join(cmd[1:])}", flush=True)
            proc = subprocess.run(cmd, cwd=root)
            if os.path.exists(out):
                with open(out) as f:
                    records.append(json.load(f))
            else:
                records.append({"kind": "peer", "engine": peer, "status": "error",
                                "error": f"exit code {proc.returncode}"})
    return records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.peer == "all":
        records = _run_all(args)
        for r in records:
            if not args.no_save and r.get("status") == "ok":
                stem = f"peer_{r['engine']}_{args.arch if not args.model else 'model'}_{args.workload}"
                print(f"saved {save_result(r, None, stem)}")
    else:
        records = [run_one(args)]
        gc.collect()
        if not args.no_save:
            stem = f"peer_{records[0]['engine']}_{args.arch if not args.model else 'model'}_{args.workload}"
            print(f"saved {save_result(records[0], args.json, stem)}")
    rows = [{"engine": r.get("engine"), "status": r.get("status"),
             "workload": (r.get("workload") or {}).get("workload"), "requests": (r.get("workload") or {}).get(
                 "requests") if r.get("engine") != "hf-static" else r.get("batch"),
             "output_tokens": r.get("output_tokens"), "wall_s": r.get("wall_s"), "output_tok_s": r.get("output_tok_s"),
             "note": r.get("error") or r.get("workload_note") or r.get("attn_implementation") or ""} for r in records]
    print()
    print(text_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
