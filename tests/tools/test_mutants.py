"""tools/mutants.py, the mutation-testing runner: one real mutant is caught, an equivalent rewrite survives,
every mutant's snippet matches the current source, and a snippet that does not match stops the run."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tools import mutants
from tools.mutants import IGNORE, MUTANTS, ROOT, check_snippets, find, run_mutant, table


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mutants") / "repo"
    shutil.copytree(ROOT, root, ignore=IGNORE)
    return root


def test_every_snippet_matches_the_source_once() -> None:
    check_snippets(ROOT, list(MUTANTS))
    assert len(MUTANTS) >= 35 and len({m.name for m in MUTANTS}) == len(MUTANTS)


def test_a_mutant_is_caught_by_both_columns_and_the_file_restored(tree: Path) -> None:
    (mutant,) = find(MUTANTS, ["rmsnorm-kernel-mean"])
    before = (tree / mutant.file).read_text()
    result = run_mutant(tree, mutant)
    assert result.caught and result.conformance.caught and result.targeted.caught, result
    assert any("conformance/test_kernels.py::test_kernel[rms_norm" in b for b in result.conformance.by), result
    assert any("test_rms_norm" in b for b in result.targeted.by), result.targeted.by
    assert (tree / mutant.file).read_text() == before
    assert "| rmsnorm-kernel-mean |" in table([result]) and "| yes (" in table([result])


def test_an_equivalent_rewrite_survives(tree: Path) -> None:
    """The runner must not report everything as caught: the same mean written another way."""
    (mutant,) = find(MUTANTS, ["rmsnorm-kernel-mean"])
    result = run_mutant(tree, replace(mutant, name="equivalent", new="var = tl.sum(h * h, axis=0) / hidden"))
    assert not result.caught and not result.conformance.caught and not result.targeted.caught, result
    assert result.conformance.by == [] and "**NO**" in table([result])


def test_an_unknown_snippet_raises_before_running(tree: Path) -> None:
    (mutant,) = find(MUTANTS, ["top-k-off-by-one"])
    stale = replace(mutant, old="drop = rank >= k_renamed")
    before = (tree / mutant.file).read_text()
    with pytest.raises(ValueError, match="occurs 0 times"):
        run_mutant(tree, stale)
    assert (tree / mutant.file).read_text() == before
    with pytest.raises(SystemExit, match="no mutant matches"):
        find(MUTANTS, ["no-such-mutant"])


def test_a_crashing_run_counts_as_caught(monkeypatch) -> None:
    """A mutant that makes pytest die by a signal (an out-of-bounds read segfaults the Triton interpreter) turns
    the suite red: it is caught, with the signal named; a positive unexpected exit code still raises."""
    monkeypatch.setattr(mutants, "run_pytest", lambda root, args, timeout: (-11, "Fatal Python error"))
    out = mutants.outcome(Path("."), "m", ("x",), 1.0)
    assert out.caught and out.by == ["(crashed: signal 11)"]
    monkeypatch.setattr(mutants, "run_pytest", lambda root, args, timeout: (3, "internal error"))
    with pytest.raises(RuntimeError, match="exited 3"):
        mutants.outcome(Path("."), "m", ("x",), 1.0)


def _tools_imports(path: Path) -> set[str]:
    """The tools/ modules that `path` imports, at module level or inside functions (`from . import x` included)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith("tools")):
            module = (node.module or "").removeprefix("tools").lstrip(".")
            names |= {module} if module else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name.removeprefix("tools.") for a in node.names if a.name.startswith("tools.")}
    return names


def test_tools_modules_import_no_circle() -> None:
    """No module under tools/ reaches itself through its imports (the two columns share tools/mutation.py)."""
    modules = {p.stem: p for p in (ROOT / "tools").glob("*.py")}
    graph = {name: _tools_imports(path) & modules.keys() for name, path in modules.items()}
    assert graph["mutants_gpu"] == {"mutation"} and "mutants" not in graph["mutation"]

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(n == target or (n not in seen and reaches(n, target, seen | {n})) for n in graph[start])

    assert [name for name in graph if reaches(name, name, set())] == []
