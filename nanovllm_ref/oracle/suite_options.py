"""Checks of the conformance suite's options and of the environment, run once when pytest starts.

A bad ``--engine``, ``--model``, ``--dtype``, ``--tp``, ``--kernels``, ``--engine-arg`` or ``--speculative-config``
is one :class:`pytest.UsageError` naming the option and what it accepts, before any test is collected
(``--reference`` has argparse choices). Engines are not built here: a ``pkg.module:factory`` is imported and looked
up, the built-in names are only matched; a server (``PREFIX:URL``) must accept a connection within seconds, else the
run stops with one line naming the URL (:func:`check_server_reachable`). ``pytest --pyargs conformance`` must import
the installed suite: a ``conformance/`` or ``golden/`` package of the working folder that shadows it is refused
(:func:`check_suite_not_shadowed`). The installed torch, transformers and triton are checked against the ranges the
package declares (pyproject.toml), so an unsupported version is refused with the range instead of failing tests.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

SUITE_DTYPES = ("float32", "bfloat16")  # the goldens' dtypes (golden/load.py)
LIVE_DTYPES = SUITE_DTYPES + ("float16",)  # --reference live: transformers computes the reference in any of them
CHECKED_PACKAGES = ("torch", "transformers", "triton")
# built-in adapters of engines that are not dependencies: engine -> (module it imports, what to pip install)
OPTIONAL_ENGINES = {"vllm": ("vllm", "vllm"), "sglang": ("sglang", "sglang"),
                    "llamacpp": ("llama_cpp", "llama-cpp-python"), "ctranslate2": ("ctranslate2", "ctranslate2"),
                    "ortgenai": ("onnxruntime_genai", "onnxruntime-genai")}


def validate_options(config: pytest.Config) -> None:
    """Every suite option that can be wrong, in the order a user reads them; the first bad one raises."""
    factory = _check_engine(config.getoption("--engine"))
    _check_engine_args(config.getoption("--engine-arg") or [], config.getoption("--engine"), factory)
    _check_speculative_config(config.getoption("--speculative-config"), config.getoption("--engine"), factory)
    _check_models(config.getoption("--model"))
    _check_dtypes(config.getoption("--dtype"), config.getoption("--reference"))
    if config.getoption("--tp") < 1:
        raise pytest.UsageError(f"--tp {config.getoption('--tp')}: must be an integer >= 1")
    if (trials := config.getoption("--invariance-trials")) < 1:
        raise pytest.UsageError(f"--invariance-trials {trials}: must be an integer >= 1")
    if config.getoption("--kernels"):
        _resolve("--kernels", config.getoption("--kernels"), "pkg.module:function returning KernelCandidates")


def _check_engine(spec: str) -> Callable | None:
    """The factory of a ``pkg.module:factory`` engine (imported), None for a built-in name or a server URL."""
    from .adapters import ADAPTERS, SERVER_ADAPTERS

    prefix, sep, rest = spec.partition(":")
    valid = (f"one of {sorted(ADAPTERS)}, PREFIX:URL with PREFIX in {sorted(SERVER_ADAPTERS)} "
             f"(e.g. openai:http://127.0.0.1:8000/v1), or pkg.module:factory")
    if not sep:
        if spec in OPTIONAL_ENGINES and not _importable(OPTIONAL_ENGINES[spec][0]):
            raise pytest.UsageError(f"--engine {spec}: the {OPTIONAL_ENGINES[spec][0]} package is not installed here "
                                    f"(pip install {OPTIONAL_ENGINES[spec][1]})")
        if spec in ADAPTERS:
            return None
        raise pytest.UsageError(f"--engine {spec!r}: unknown engine; expected {valid}")
    if prefix in SERVER_ADAPTERS and rest.startswith(("http://", "https://", "//")):
        if rest.startswith("//"):
            raise pytest.UsageError(f"--engine {spec!r}: a server URL needs its scheme, e.g. {prefix}:http:{rest}")
        return None
    if prefix in SERVER_ADAPTERS and not _is_dotted_name(rest):
        raise pytest.UsageError(f"--engine {spec!r}: {prefix}: takes a server URL starting with http:// or https://")
    return _resolve("--engine", spec, valid)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # already imported without a spec (a stand-in module): there
        return True


def _is_dotted_name(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _resolve(option: str, spec: str, valid: str) -> Callable:
    """Import ``pkg.module:attr`` (attr may be dotted) and return it; any failure is a usage error."""
    from ..testing.interpreter import use_triton_interpreter

    module_name, _, attr = spec.partition(":")
    if not (_is_dotted_name(module_name) and _is_dotted_name(attr)):
        raise pytest.UsageError(f"{option} {spec!r}: expected {valid}")
    use_triton_interpreter()  # as the suite's conftest does: a module defining Triton kernels sees it set (CPU)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise pytest.UsageError(f"{option} {spec!r}: cannot import {module_name!r}: {e}") from None
    for part in attr.split("."):
        if not hasattr(target, part):
            raise pytest.UsageError(f"{option} {spec!r}: module {module_name!r} has no {attr!r}") from None
        target = getattr(target, part)
    if not callable(target):
        raise pytest.UsageError(f"{option} {spec!r}: {attr!r} is not callable")
    return target


def parse_engine_args(items: list[str]) -> tuple[tuple[str, Any], ...]:
    """``["KEY=VALUE", ...]`` as ``((key, value), ...)``; VALUE is JSON when it parses (numbers, true, null,
    lists), else the string itself."""
    parsed: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise pytest.UsageError(f"--engine-arg {item!r}: expected KEY=VALUE with KEY a Python identifier")
        try:
            parsed[key.strip()] = json.loads(raw)
        except ValueError:
            parsed[key.strip()] = raw
    return tuple(parsed.items())


def engine_arg_keys(engine: str, factory: Callable | None) -> set[str] | None:
    """The ``--engine-arg`` keys ``engine`` accepts, or None when it takes any (a ``**kwargs`` factory)."""
    from .adapters import ADAPTERS, SERVER_ADAPTERS, resolve_factory

    if engine == "nanovllm_ref":  # its adapter passes everything to LLM(...): the Config fields
        import dataclasses

        from ..config import Config

        return {f.name for f in dataclasses.fields(Config)} - {"model", "dtype"}
    if factory is None:
        prefix = engine.partition(":")[0]
        factory = resolve_factory(ADAPTERS[engine] if engine in ADAPTERS else SERVER_ADAPTERS[prefix])
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check against
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    positional = {"base_url", "url", "model_path", "model", "dtype"}  # what load_adapter passes itself
    return {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)} - positional


def _check_engine_args(items: list[str], engine: str, factory: Callable | None) -> None:
    keys = [k for k, _ in parse_engine_args(items)]
    if not keys:
        return
    try:
        accepted = engine_arg_keys(engine, factory)
    except ImportError:  # an optional engine (vllm, sglang) that is not installed: its adapter says so later
        return
    unknown = [k for k in keys if accepted is not None and k not in accepted]
    if unknown:
        raise pytest.UsageError(f"--engine-arg {unknown[0]}=...: engine {engine!r} takes no setting {unknown[0]!r}; "
                                f"valid keys: {', '.join(sorted(accepted))}")


def _check_speculative_config(raw: str | None, engine: str, factory: Callable | None) -> None:
    """``--speculative-config JSON``: a JSON object, for an engine whose factory takes ``speculative_config``."""
    from .spec_decode import option_config

    try:
        option_config(raw)
    except ValueError as e:  # (json's JSONDecodeError is one)
        raise pytest.UsageError(f"--speculative-config {raw!r}: {e}") from None
    if raw is None:
        return
    try:
        accepted = engine_arg_keys(engine, factory)
    except ImportError:  # an optional engine that is not installed: its adapter says so later
        return
    if accepted is not None and "speculative_config" not in accepted:
        raise pytest.UsageError(f"--speculative-config: engine {engine!r} takes no speculative_config (its factory's "
                                "settings: " + ", ".join(sorted(accepted)) + ")")


def _check_models(raw: Any) -> None:
    from golden.load import list_checkpoints

    raw = [raw] if isinstance(raw, str) else list(raw or [])  # a str if a plugin loaded earlier owns --model
    from .dialects import split_dialect

    for name in (m.strip() for opt in raw for m in opt.split(",") if m.strip()):
        try:
            base, _ = split_dialect(name)  # NAME@rope_scaling: a golden in the published config dialect
        except ValueError as e:
            raise pytest.UsageError(f"--model {name!r}: {e}") from None
        if base not in list_checkpoints() and not os.path.isdir(name):
            raise pytest.UsageError(f"--model {name!r}: neither a golden checkpoint ({', '.join(list_checkpoints())}) "
                                    "nor a checkpoint folder (a golden name may end in @rope_scaling)")


def _check_dtypes(raw: str, reference: str) -> None:
    valid = LIVE_DTYPES if reference == "live" else SUITE_DTYPES
    dtypes = [d.strip() for d in raw.split(",")]
    for d in dtypes:
        if d not in valid:
            hint = " (float16 needs --reference live)" if d == "float16" else ""
            raise pytest.UsageError(f"--dtype {d!r}: valid dtypes are {', '.join(valid)}, comma-separated{hint}")


def check_versions(requirements: list[str] | None = None) -> None:
    """Refuse torch, transformers or triton outside the range this package declares (its installed metadata);
    nothing to check in a source checkout that was never installed."""
    from importlib import metadata

    from packaging.requirements import Requirement

    if requirements is None:
        try:
            requirements = metadata.requires("nanovllm_ref") or []
        except metadata.PackageNotFoundError:
            return
    for line in requirements:
        req = Requirement(line)
        if req.name not in CHECKED_PACKAGES:
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            continue  # torch and transformers are dependencies; triton is optional (the kernel module skips)
        if req.specifier and not req.specifier.contains(have.split("+")[0], prereleases=True):
            raise pytest.UsageError(f"{req.name} {have} is outside the range nanovllm_ref supports "
                                    f"({req.name}{req.specifier}): install a supported version")


SUITE_PACKAGES = ("conformance", "golden")  # installed beside nanovllm_ref; a folder's own copy must not shadow them


def installed_root() -> Path:
    """The folder holding the installed nanovllm_ref, conformance and golden packages (site-packages, a checkout)."""
    import nanovllm_ref

    return Path(nanovllm_ref.__file__).resolve().parent.parent


def names_the_suite(config: pytest.Config) -> bool:
    """Whether the run is ``pytest --pyargs conformance[.module|::test]``: the installed suite by import name."""
    if not config.getoption("pyargs", False):
        return False
    return any(str(a).replace("/", ".").split("::")[0].split(".")[0] == "conformance" for a in config.args)


def check_suite_not_shadowed(config: pytest.Config) -> None:
    """``--pyargs conformance`` imports whichever ``conformance`` comes first on sys.path: a folder with its own
    ``conformance/`` (or ``golden/``) package would run that instead, and could pass. Refused, naming both."""
    if not names_the_suite(config):
        return
    for name in SUITE_PACKAGES:
        found = _package_dir(name)
        expected = installed_root() / name
        if found is not None and found != expected.resolve():
            raise pytest.UsageError(f"the {name!r} package imported from {found} shadows the installed suite's "
                                    f"{expected}: run from another folder, or rename that package "
                                    "(`nanovllm-ref conformance` always runs the installed suite)")


def _package_dir(name: str) -> Path | None:
    import sys

    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin).resolve().parent if origin else None


def check_server_reachable(spec: str, timeout_s: float = 5.0) -> None:
    """An ``--engine PREFIX:URL`` whose server accepts no connection stops the run at once, in one line, instead
    of every test failing on it."""
    from .adapters import server_url
    from .openai_adapter import unreachable

    url = server_url(spec)
    if url is not None and (why := unreachable(url, timeout_s)) is not None:
        raise pytest.UsageError(f"--engine {spec}: no server answers at {url} ({why}): start it first, "
                                "or fix the URL")
