"""No two modules of ``reliable`` or ``broker_sim`` import each other, directly or round a loop.

Every import statement counts: module level, inside functions and under ``TYPE_CHECKING``. A back edge hidden
in a function or a type-only import does not fail at runtime, but it still ties the modules into one unit
that can only be read, tested and changed together. A service that needs a little of its owner states that
little as a ``Protocol`` instead of importing the owner (``broker_sim.broker.context.BrokerContext``,
``broker_sim.client.pull_service.PullHost``).

Package ``__init__`` modules that only hand names on are left out of the graph: ``from pkg import name``
is followed to the submodule that defines ``name`` when ``pkg/name.py`` exists, and otherwise to ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def compiled(package: str, name: str) -> bool:
    """Whether ``package.name`` is an extension module (``broker_sim.store._codec``), not a Python file."""
    directory = ROOT.joinpath(*package.split("."))
    return any(directory.glob(f"{name}.*.so")) or (directory / f"{name}.c").exists()


def import_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (excluding itself)."""
    files = {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        targets: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in files:
                        targets.add(sub)
                    elif not compiled(base, alias.name):  # a name the package itself defines or hands on
                        targets.add(base)
        graph[mod] = {t for t in targets if t in files and t != mod}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_are_found() -> None:
    """The checker itself: a loop of three and a pair are reported, a chain is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["d", "e"]]


@pytest.mark.parametrize("package", ["reliable", "broker_sim"])
def test_no_module_imports_loop_back_to_itself(package: str) -> None:
    assert cycles(import_graph(package)) == []
