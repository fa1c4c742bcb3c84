"""`nanovllm-ref`: serve, generate, chat, bench, conformance (the `vllm serve` / `ollama run` habit).

    nanovllm-ref serve MODEL [--port 8000] [--served-model-name NAME] [--chat-template FILE]
    nanovllm-ref generate MODEL "def main(" "import os" [--max-tokens 32 --temperature 0]
    nanovllm-ref chat MODEL [--chat-template FILE]        # interactive, streaming; /exit or Ctrl-D quits
    nanovllm-ref bench [--arch A --workload W ...]        # engine throughput / latency vs the roofline
    nanovllm-ref conformance --engine SPEC --model NAME [pytest flags]

MODEL is a checkpoint folder or the name of a golden checkpoint (qwen3-tiny, ...), from any folder.
A mistake on the command line (a wrong path, an unknown dtype, a number out of range) prints one line and
exits 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from typing import Any

from .. import __version__
from ..config import DEVICES, DTYPES


class UsageError(Exception):
    """A mistake in the command line or in what it names: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints the usage block too: one line is enough
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def checked(make: Any, *args: Any, **kwargs: Any) -> Any:
    """`make(*args, **kwargs)`; a ValueError, TypeError or OSError (bad input: the engine validates before it
    changes anything) becomes a UsageError with the same message."""
    try:
        return make(*args, **kwargs)
    except (ValueError, TypeError, OSError) as e:
        raise UsageError(str(e)) from e


def engine_kwargs(args: argparse.Namespace) -> dict:
    try:
        kwargs = json.loads(args.config)
    except ValueError as e:
        raise UsageError(f"--config: not valid JSON ({e}): {args.config!r}") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--config: a JSON object of LLM settings is needed, got {args.config!r}")
    for name in ("dtype", "max_model_len", "device", "batch_invariant"):
        if getattr(args, name, None) is not None:
            kwargs[name] = getattr(args, name)
    if getattr(args, "speculative_config", None) is not None:
        kwargs["speculative_config"] = speculative_kwargs(args.speculative_config)
    return kwargs


def speculative_kwargs(text: str) -> dict:
    """--speculative-config's JSON (vLLM's flag and fields); a draft `model` may be a golden checkpoint's name."""
    try:
        spec = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--speculative-config: not valid JSON ({e}): {text!r}") from None
    if not isinstance(spec, dict):
        raise UsageError(f"--speculative-config: a JSON object is needed, got {text!r}")
    if isinstance(spec.get("model"), str):
        from golden.load import resolve_model

        spec["model"] = checked(resolve_model, spec["model"])
    return spec


def model_folder(args: argparse.Namespace) -> str:
    """MODEL's checkpoint folder: a folder as given, a golden checkpoint's name resolved (the CLI's reading, not
    the engine's: `LLM` takes a folder)."""
    from golden.load import resolve_model

    return checked(resolve_model, args.model)


def engine_settings(args: argparse.Namespace) -> dict:
    """The engine's settings, checked (the model resolved, the config validated) before torch loads."""
    from ..config import Config

    kwargs = engine_kwargs(args)
    checked(Config.from_kwargs, model_folder(args), **kwargs)
    return kwargs


def load_llm(args: argparse.Namespace) -> Any:
    """The engine. TP ranks are spawned with SIGINT ignored, which they keep: the terminal's Ctrl-C (sent to the
    whole process group) then reaches only this process, which stops a reply or shuts the ranks down in order."""
    kwargs = engine_settings(args)
    from ..llm import LLM

    tp = kwargs.get("tensor_parallel_size", 1)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if isinstance(tp, int) and tp > 1 else None
    try:
        llm = checked(LLM, model_folder(args), **kwargs)
        llm.model_name = args.model  # as given, a golden name too: the served name's default and an alias
        return llm
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a checkpoint folder, or a golden checkpoint's name (e.g. qwen3-tiny)")
    p.add_argument("--dtype", default=None, choices=DTYPES)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--device", default=None, choices=DEVICES)
    p.add_argument("--config", default="{}", help='more engine config as JSON, e.g. \'{"max_num_seqs": 64}\'')
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding (vLLM\'s fields), e.g. \'{"method": "ngram", '
                        '"num_speculative_tokens": 3}\' or \'{"model": "qwen3-tiny", "num_speculative_tokens": 3}\'')
    p.add_argument("--batch-invariant", action="store_true", default=None,
                   help="a request's tokens and logprobs bitwise independent of the rest of the batch")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="tracebacks for errors")


def add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    p.add_argument("--served-model-name", nargs="+", default=[], help="names the API accepts (default: MODEL's "
                   "name); the first is the one responses report")
    p.add_argument("--chat-template", default=None, help="a Jinja chat template file (or the template text), "
                   "for checkpoints without one (e.g. ChatML)")
    p.add_argument("--max-request-bytes", type=int, default=4 << 20, help="larger request bodies get 413")
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds to receive the request headers")
    p.add_argument("--body-timeout", type=float, default=30.0, help="seconds to wait for each part of the body")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--no-access-log", action="store_true", help="no log line per request on stderr")


def sampling(args: argparse.Namespace) -> Any:
    from ..sampling_params import SamplingParams

    return checked(SamplingParams, max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true", help="generate max-tokens tokens whatever comes")


def _serve(args: argparse.Namespace) -> int:
    engine_settings(args)  # (the server's modules load torch)
    try:
        from .server import bind, config_from_args, serve
    except ImportError as e:
        raise UsageError(f"serve needs the serving extra: pip install 'nanovllm_ref[serve]' ({e})") from None

    config = checked(config_from_args, args)  # a bad flag fails before the model loads
    try:  # the port is taken before the model loads, so that a busy one is said at once
        sock = bind(config.host, config.port)
    except OSError as e:
        raise UsageError(f"--host {config.host} --port {config.port}: cannot listen there "
                         f"({e.strerror or e}); pick another port (--port 0: any free one)") from e
    try:
        llm = load_llm(args)
    except BaseException:
        sock.close()
        raise
    serve(llm, config, sock)
    return 0


def _generate(args: argparse.Namespace) -> int:
    params = sampling(args)
    with load_llm(args) as llm:
        outs = checked(llm.generate, args.prompts, params, use_tqdm=False)
        for prompt, out in zip(args.prompts, outs):
            print(f"--- {prompt!r} ({len(out.token_ids)} tokens, {out.finish_reason})\n{prompt}{out.text}")
    return 0


def _chat(args: argparse.Namespace) -> int:
    from ..chat_template import read_chat_template
    from .chat import ChatSession

    params, template = sampling(args), checked(read_chat_template, args.chat_template)
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    with load_llm(args) as llm:
        if llm.tokenizer is None or not (template or getattr(llm.tokenizer, "chat_template", None)):
            raise UsageError("this model has no tokenizer or chat template: pass --chat-template FILE (or chatml)")
        return ChatSession(llm, params, template, args.model).run()


def _bench(args: argparse.Namespace, rest: list[str]) -> int:
    from nanovllm_ref.testing.bench.cli import main as bench

    return bench(rest)


# pytest started without the working folder on sys.path (`python -m` and `-c` put it first): a folder's own
# `conformance/` or `golden/` package cannot stand in for the installed suite or its goldens
PYTEST_OUTSIDE_CWD = ("import os, sys\n"
                      "if sys.path and sys.path[0] in ('', os.getcwd()): del sys.path[0]\n"
                      "import pytest\nsys.exit(pytest.main())")


PYTEST_USAGE_ERROR = 4  # pytest.ExitCode.USAGE_ERROR


def suite_dir() -> str:
    """The installed conformance suite's folder: the one beside this nanovllm_ref, never one found on sys.path."""
    from ..oracle.suite_options import installed_root

    folder = installed_root() / "conformance"
    if not (folder / "conftest.py").is_file():
        raise UsageError(f"the conformance suite is not installed beside nanovllm_ref ({folder}): "
                         "pip install 'nanovllm_ref[conformance]'")
    return str(folder)


def _say_shadows_ignored(folder: str) -> None:
    """A package of the working folder named like the suite's is not what runs: said, so nobody thinks it ran."""
    import os
    from pathlib import Path

    from ..oracle.suite_options import SUITE_PACKAGES, installed_root

    for name in SUITE_PACKAGES:
        here = Path(os.getcwd(), name)
        if (here / "__init__.py").is_file() and here.resolve() != installed_root() / name:
            print(f"nanovllm-ref conformance: {here} is not the installed suite's {name!r} package: it is ignored; "
                  f"running {folder}", file=sys.stderr, flush=True)


def _conformance(args: argparse.Namespace, rest: list[str]) -> int:
    folder = suite_dir()
    _say_shadows_ignored(folder)
    cmd = [sys.executable, "-c", PYTEST_OUTSIDE_CWD, folder, "--engine", args.engine]
    code = subprocess.call(cmd + (["--model", args.model] if args.model else []) + rest)
    return 2 if code == PYTEST_USAGE_ERROR else code  # a bad option (one line from pytest): a CLI mistake


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="nanovllm-ref", description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"nanovllm-ref {__version__}")
    top.add_argument("--debug", action="store_true", help="tracebacks instead of one-line errors")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("serve", help="an OpenAI-compatible server (completions, chat, models, metrics, /docs)")
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
    sub.add_parser("bench", help="the engine benchmark (nanovllm_ref/testing/bench); flags pass through",
                   add_help=False)
    p = sub.add_parser("conformance", help="the conformance suite against an engine; other flags go to pytest")
    p.add_argument("--engine", default="nanovllm_ref", help="nanovllm_ref | openai:URL | vllm | module:factory")
    p.add_argument("--model", default=None, help="a golden checkpoint name or a checkpoint folder (default: all)")
    return top


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # everything after `bench` is the benchmark's (its --help included)
        return _bench(argparse.Namespace(), argv[1:])
    args, rest = parser().parse_known_args(argv)
    if rest and args.command != "conformance":
        parser().error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "conformance":
            return _conformance(args, rest)
        return {"serve": _serve, "generate": _generate, "chat": _chat}[args.command](args)
    except UsageError as e:
        if args.debug:  # the traceback of what went wrong, not of its translation
            if e.__cause__ is not None:
                raise e.__cause__ from None
            raise
        print(f"nanovllm-ref {args.command}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"nanovllm-ref {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
