"""`nanovllm-ref`: serve, generate, chat, bench, conformance (the `vllm serve` / `ollama run` habit).

    nanovllm-ref serve MODEL [--port 8000] [--served-model-name NAME] [--chat-template FILE]
    nanovllm-ref generate MODEL "def main(" "import os" [--max-tokens 32 --temperature 0]
    nanovllm-ref chat MODEL [--chat-template FILE]        # interactive, streaming; an empty line or EOF ends
    nanovllm-ref bench [perf.bench_engine flags]          # the perf entry point (from a source checkout)
    nanovllm-ref conformance --engine SPEC --model NAME [pytest flags]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def engine_kwargs(args: argparse.Namespace) -> dict:
    try:
        kwargs = json.loads(args.config)
    except ValueError as e:
        raise SystemExit(f"--config: not valid JSON ({e}): {args.config!r}") from None
    if not isinstance(kwargs, dict):
        raise SystemExit(f"--config: a JSON object of LLM settings is needed, got {args.config!r}")
    for name in ("dtype", "max_model_len", "device"):
        if getattr(args, name, None) is not None:
            kwargs[name] = getattr(args, name)
    return kwargs


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a checkpoint folder")
    p.add_argument("--dtype", default=None, help="auto | float32 | bfloat16 | float16")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--device", default=None, help="auto | cuda | cpu")
    p.add_argument("--config", default="{}", help='more engine config as JSON, e.g. \'{"max_num_seqs": 64}\'')


def add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    p.add_argument("--served-model-name", nargs="+", default=[], help="names the API accepts (default: the path); "
                   "the first is the one responses report")
    p.add_argument("--chat-template", default=None, help="a Jinja chat template file (or the template text), "
                   "for checkpoints without one (e.g. ChatML)")
    p.add_argument("--max-request-bytes", type=int, default=4 << 20, help="larger request bodies get 413")
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds to receive the request headers")
    p.add_argument("--body-timeout", type=float, default=30.0, help="seconds to wait for each part of the body")
    p.add_argument("--log-level", default="warning")


def _sampling(args: argparse.Namespace) -> object:
    from ..sampling_params import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed)


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def _serve(args: argparse.Namespace) -> int:
    from ..llm import LLM

    try:
        from .server import config_from_args, serve
    except ImportError as e:
        print(f"serve needs the serving extra: pip install 'nanovllm_ref[serve]' ({e})", file=sys.stderr)
        return 2

    config = config_from_args(args)  # fails on a bad flag before the model loads
    serve(LLM(args.model, **engine_kwargs(args)), config)
    return 0


def _generate(args: argparse.Namespace) -> int:
    from ..llm import LLM
    with LLM(args.model, **engine_kwargs(args)) as llm:
        for prompt, out in zip(args.prompts, llm.generate(args.prompts, _sampling(args), use_tqdm=False)):
            print(f"--- {prompt!r} ({len(out.token_ids)} tokens, {out.finish_reason})\n{prompt}{out.text}")
    return 0


def _chat(args: argparse.Namespace) -> int:
    from ..llm import LLM
    from .chat_template import read_chat_template

    template = read_chat_template(args.chat_template)
    with LLM(args.model, **engine_kwargs(args)) as llm:
        tok = llm.tokenizer
        if tok is None or not (template or tok.chat_template):
            print("this model has no tokenizer or chat template: pass --chat-template FILE", file=sys.stderr)
            return 2
        messages: list[dict] = []
        while (line := _read("you> ")):
            messages.append({"role": "user", "content": line})
            text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
            ids, params = tok.encode(text, add_special_tokens=False), _sampling(args)
            rid, shown = llm.add_request(ids, params), ""
            print("assistant> ", end="", flush=True)
            while not (finished := llm.step()):  # one request: the step that finishes it returns it
                shown += (piece := llm.engine.new_text(llm.engine.requests[rid]))
                print(piece, end="", flush=True)
            print(finished[0].text[len(shown):], flush=True)  # the engine's text: `shown` is a prefix of it
            messages.append({"role": "assistant", "content": finished[0].text})
    return 0


def _read(prompt: str) -> str:
    try:
        return input(prompt).strip()
    except EOFError:
        return ""


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    root = _repo_root()
    if not os.path.isfile(os.path.join(root, "perf", "bench_engine.py")):
        print("bench runs perf/bench_engine.py from a source checkout of nanovllm_ref; none found", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "perf.bench_engine", *rest], cwd=root)


def _conformance(args: argparse.Namespace, rest: list[str]) -> int:
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "--engine", args.engine]
    return subprocess.call(cmd + (["--model", args.model] if args.model else []) + rest)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="nanovllm-ref", description=__doc__.splitlines()[0],
                                  epilog=__doc__.split("\n", 2)[2],
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("serve", help="an OpenAI-compatible server (completions, chat, models, health, /docs)")
    add_engine_args(p)
    add_server_args(p)
    p = sub.add_parser("generate", help="generate for each PROMPT and print the texts")
    add_engine_args(p)
    p.add_argument("prompts", nargs="+", metavar="PROMPT")
    _add_sampling_args(p)
    p = sub.add_parser("chat", help="chat interactively, streaming the replies (needs a chat template)")
    add_engine_args(p)
    p.add_argument("--chat-template", default=None, help="a Jinja chat template file (or the template text)")
    _add_sampling_args(p)
    sub.add_parser("bench", help="the engine benchmark (perf/bench_engine.py); flags pass through", add_help=False)
    p = sub.add_parser("conformance", help="the conformance suite against an engine; other flags go to pytest")
    p.add_argument("--engine", default="nanovllm_ref", help="nanovllm_ref | openai:URL | vllm | module:factory")
    p.add_argument("--model", default=None, help="a golden checkpoint name (default: all)")
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # everything after `bench` is perf.bench_engine's (its --help included)
        return _bench(argparse.Namespace(), argv[1:])
    args, rest = parser().parse_known_args(argv)
    if args.command == "conformance":
        return _conformance(args, rest)
    if rest:
        parser().error(f"unrecognized arguments: {' '.join(rest)}")
    return {"serve": _serve, "generate": _generate, "chat": _chat}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
