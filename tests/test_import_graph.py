"""Imports point one way: no module of introspect or benchmarks imports itself back.

A circle makes the layering unreadable (which file is the lower one?) and is only kept
working by imports hidden inside functions, so those count too: a lazy `from x import y`
that closes a loop is still a circle. Importing a package (`from introspect import files`)
runs its `__init__`, so it is an edge to that `__init__` and all it re-exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("introspect", "benchmarks")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Map every module's dotted name to its file; a package is named by its __init__."""
    modules = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """Every dotted name an import statement may load: `from a import b` is `a` and `a.b`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        up = parts[: len(parts) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """Module -> module it imports, anywhere in the file; each edge keeps its import lines."""
    modules = module_files(root)
    graph = nx.DiGraph()
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in imported_names(node, package):
                if target in modules and target != name:
                    graph.add_edge(name, target)
                    graph.edges[name, target].setdefault("lines", set()).add(node.lineno)
    return graph


def describe(graph: nx.DiGraph, circle: set[str]) -> str:
    """One circle as the import lines inside it, so a failure says which lines to move."""
    edges = sorted(graph.subgraph(circle).edges(data="lines"))
    lines = [f"  {a} -> {b} (line {', '.join(map(str, sorted(at)))})" for a, b, at in edges]
    return f"{len(circle)} modules in a circle:\n" + "\n".join(lines)


def test_no_module_imports_itself_back() -> None:
    graph = import_graph()
    assert graph.number_of_nodes() > 50, "the graph found no imports: has the layout moved?"
    circles = [c for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not circles, "\n".join(describe(graph, c) for c in sorted(circles, key=min))


def test_the_graph_sees_imports_inside_functions(tmp_path: Path) -> None:
    package = tmp_path / "introspect"
    package.mkdir()
    (tmp_path / "benchmarks").mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from introspect import high\n")
    (package / "high.py").write_text("from . import low\n")
    graph = import_graph(tmp_path)
    assert {("introspect.low", "introspect.high"), ("introspect.high", "introspect.low")} <= set(
        graph.edges
    )
