"""The import graph of ``minicb/``, read from the source: which module imports which.

Every ``import`` counts, wherever it stands: at module top, inside a function (it runs
when the function does) or under ``if TYPE_CHECKING:`` (it runs for no one, but a reader
still has to know the other module). ``Edge.run_time`` tells the first two from the last.
A name imported from a package counts as the submodule when it is one
(``from minicb.core import events``), as the package otherwise.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edge:
    importer: str  # dotted module names
    imported: str
    line: int
    run_time: bool  # False: only under `if TYPE_CHECKING:`


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((ROOT / "minicb").rglob("*.py"))}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden |= {id(inner) for statement in node.body for inner in ast.walk(statement)}
    return hidden


def _targets(node: ast.AST, known: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for alias in node.names:
            submodule = f"{node.module}.{alias.name}"
            yield submodule if submodule in known else node.module


def edges() -> list[Edge]:
    known = modules()
    found = set()
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        hidden = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            for target in _targets(node, known):
                if not target.startswith("minicb"):
                    continue
                while target not in known and "." in target:  # an attribute of a module
                    target = target.rsplit(".", 1)[0]
                found.add(Edge(name, target, node.lineno, id(node) not in hidden))
    return sorted(found, key=lambda e: (e.importer, e.line, e.imported))


def cycles(pairs: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in pairs:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)
