"""The package's module-level import graph: no cycles and at most MAX_LEVELS modules on any chain.

Read with `ast` (nothing is imported): an edge a -> b is an `import` / `from ... import` of a module of
rlhf_mcore at module level of a (inside a module-level `if`/`try` too), never one inside a function. A
package's `__init__` counts as a module of its own; `from rlhf_mcore.x import y` names the submodule x.y
when that is a module. Levels count modules on the chain: a module importing nothing of ours is level 1.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.support.paths import ROOT

PACKAGE = ROOT / "rlhf_mcore"
MAX_LEVELS = 7


def module_files(root: Path) -> dict[str, Path]:
    mods = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def imported_modules(name: str, path: Path, node: ast.stmt, mods: dict[str, Path]) -> set[str]:
    """The package's modules that one import statement of module `name` loads by name."""
    pkg = PACKAGE.name
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in mods}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join(here + ([node.module] if node.module else []))
    if base.split(".")[0] != pkg:
        return set()
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names} & set(mods)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    mods = module_files(root)
    graph = {}
    for name, path in mods.items():
        deps = set()
        for stmt in ast.parse(path.read_text()).body:  # module level: top statements and their if/try blocks
            nodes = ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else [stmt]
            for node in nodes:
                deps |= imported_modules(name, path, node, mods)
        graph[name] = deps - {name}
    return graph


def longest_chain(graph: dict[str, set[str]]) -> tuple[str, ...]:
    """The longest import chain (first module imports the second ...); raises ValueError on a cycle."""

    @functools.cache
    def chain(mod: str, stack: tuple[str, ...] = ()) -> tuple[str, ...]:
        if mod in stack:
            raise ValueError("import cycle: " + " -> ".join(stack[stack.index(mod):] + (mod,)))
        below = [chain(dep, stack + (mod,)) for dep in sorted(graph[mod])]
        return (mod,) + max(below, key=len, default=())

    return max((chain(m) for m in sorted(graph)), key=len)


def test_longest_chain_and_cycle_detection_on_a_toy_graph():
    graph = {"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": set()}
    assert longest_chain(graph) == ("a", "b", "c")
    with pytest.raises(ValueError, match="import cycle: b -> c -> b"):
        longest_chain({"a": {"b"}, "b": {"c"}, "c": {"b"}})


def test_graph_reads_our_imports():
    graph = import_graph()
    assert graph["rlhf_mcore.models.logprobs"] == {"rlhf_mcore.models.heads"}
    assert "rlhf_mcore.registry" in graph["rlhf_mcore.algorithms.advantages"]
    assert not any(dep.startswith("torch") for deps in graph.values() for dep in deps)


def test_import_graph_is_shallow_and_acyclic():
    chain = longest_chain(import_graph())
    assert len(chain) <= MAX_LEVELS, (f"{len(chain)} levels of module-level imports (at most {MAX_LEVELS}): "
                                      + " -> ".join(chain) + ". Move helpers down or import the defining module.")
