"""The import structure of the tree, read from the source (AST; nothing is imported).

Two rules. No circle: the graph of imports among the project's modules (nanovllm_ref, conformance, golden, tools,
perf), module-level and function-level imports alike, is acyclic; only imports under `if TYPE_CHECKING:` are left
out, since they never run. Layers: the engine (nanovllm_ref's engine, layers, models, attention, kernels and
structured outputs, and its own modules: the package, llm, config, loader, outputs, sampling_params, distributed,
chat_template) never imports what is built on it (the server, the oracle, the goldens, the test helpers, the
conformance suite), and the goldens never import the oracle, so that `golden` stays data plus its makers. And perf/
names no module as the bench package it is built on does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nanovllm_ref", "conformance", "golden", "tools", "perf")
ENGINE = tuple(f"nanovllm_ref.{p}" for p in ("engine", "layers", "models", "attention", "kernels"))
ABOVE_ENGINE = ("nanovllm_ref.serve", "nanovllm_ref.oracle", "golden", "nanovllm_ref.testing", "conformance")
# the engine's own top-level modules (the package itself included: importing it must not pull the layers above in)
ENGINE_MODULES = tuple(f"nanovllm_ref{m}" for m in ("", ".llm", ".config", ".loader", ".outputs", ".sampling_params",
                                                     ".distributed", ".chat_template"))
# (importer: a package prefix, or "=" + one module; forbidden import prefixes)
LAYER_RULES = (
    *((pkg, ABOVE_ENGINE) for pkg in ENGINE),
    *((f"={m}", ABOVE_ENGINE) for m in ENGINE_MODULES),
    ("golden", ("nanovllm_ref.oracle",)),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    modules = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            modules[module_name(path)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node except the bodies of `if TYPE_CHECKING:` blocks (their else branches do run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported_names(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules a module imports, as import-linter counts them: `import a.b` names a.b, `from a import
    b` names a.b where that is a module, else a; relative imports resolved; other projects' modules left out."""
    is_package = path.name == "__init__.py"
    names = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(_resolve(alias.name, modules) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.add(sub if sub in modules else _resolve(base, modules))
    return names - {None, name}


def _resolve(imported: str, modules: dict[str, Path]) -> str | None:
    """The project module a dotted name lies in: its longest known prefix (`a.b.func` -> `a.b`)."""
    parts = imported.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_names(path, name, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for importer, targets in sorted(graph.items()):
        for prefix, forbidden in LAYER_RULES:
            if importer == prefix[1:] if prefix.startswith("=") else _within(importer, prefix):
                found += [f"{importer} -> {t}" for t in sorted(targets) if any(_within(t, f) for f in forbidden)]
    return found


def test_no_import_circle():
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    violations = layer_violations(import_graph())
    assert not violations, "imports against the layering:\n" + "\n".join(violations)


def test_the_perf_suite_names_no_module_as_the_bench_package_does():
    """perf/ is built on nanovllm_ref.testing.bench: a module of the same name in both (device, tables) is two
    things under one name, and `from .device import` means a different file in each folder."""
    bench = {p.stem for p in (ROOT / "nanovllm_ref" / "testing" / "bench").glob("*.py")}
    names = {p.stem for p in (ROOT / "perf").glob("*.py")} & bench
    assert names <= {"__init__"}, f"perf/ and nanovllm_ref/testing/bench/ both have {sorted(names - {'__init__'})}"


# The checker's own tests: it must see what it claims to.

def test_the_checker_sees_function_level_imports_and_skips_type_checking(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.hidden\n"
                   "else:\n    import a.shown\ndef f():\n    from golden import load\n")
    modules = {"a.shown": src, "a.hidden": src, "golden.load": src}
    assert imported_names(src, "m", modules) == {"a.shown", "golden.load"}


def test_the_checker_resolves_relative_imports(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .sub import x\n")
    (pkg / "mod.py").write_text("from ..q import y\nfrom . import z, w\n")
    modules = {"p": pkg, "p.sub": pkg, "p.z": pkg, "q": pkg}
    assert imported_names(pkg / "__init__.py", "p", modules) == {"p.sub"}
    assert imported_names(pkg / "mod.py", "p.mod", modules) == {"q", "p.z", "p"}  # w is not a module: p


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_checker_finds_circles(graph, expected):
    assert find_cycles(graph) == expected


def test_the_checker_flags_an_engine_module_importing_the_server():
    graph = {"nanovllm_ref.engine.x": {"nanovllm_ref.serve.chat"}, "nanovllm_ref.serve.chat": set(),
             "nanovllm_ref": {"golden.load"}, "nanovllm_ref.serve.cli": {"golden.load", "nanovllm_ref.oracle"}}
    assert layer_violations(graph) == ["nanovllm_ref -> golden.load",
                                       "nanovllm_ref.engine.x -> nanovllm_ref.serve.chat"]
