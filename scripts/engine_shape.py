"""The partition engine's shape: module sizes, import circles, and what each collaborator
touches of the partition's state.

    python scripts/engine_shape.py          # prints the table

Read from the source (``ast``), nothing imported: every ``import`` and ``from ... import`` of
a module counts, those under ``if TYPE_CHECKING:`` and inside functions included. A
collaborator's use of the state is every attribute read or written on the names ``p`` or ``m``,
or on ``self.p`` or ``self.m`` (the engine's collaborators name the partition they work on so,
and nothing else). ``tests/unit/test_engine_shape.py`` holds the engine to it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "queues" / "engine"
PACKAGE = "queues.engine"
#: the names a collaborator gives the partition's state (see the module's text).
STATE_NAMES = frozenset({"p", "m"})


def modules() -> dict[str, Path]:
    """``{dotted name: path}`` of the engine's modules (the package's ``__init__`` as the package)."""
    out = {}
    for path in sorted(ENGINE.glob("*.py")):
        name = PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"
        out[name] = path
    return out


def lines(path: Path) -> int:
    """Lines of a file, as ``wc -l`` counts them."""
    return path.read_bytes().count(b"\n")


def _imported(node: ast.Import | ast.ImportFrom, here: str, known: set[str]) -> set[str]:
    """The engine modules one import statement of module ``here`` names."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:  # relative: from the package ``here`` lies in
        parts = here.split(".")[: -node.level] if here != PACKAGE else PACKAGE.split(".")[: 1 - node.level]
        base = ".".join([*parts, base] if base else parts)
    out = set()
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            out.add(f"{base}.{alias.name}")  # from queues.engine import keys
        elif base in known:
            out.add(base)  # from queues.engine.keys import message_key
    return out


def import_graph() -> dict[str, set[str]]:
    """``{module: engine modules it imports}``, every import statement of the module counted."""
    known = set(modules())
    graph: dict[str, set[str]] = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(node, name, known)
        edges.discard(name)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan): each is
    an import circle, or several that share modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _state_base(node: ast.expr) -> bool:
    """``node`` names the partition's state: ``p``, ``m``, or ``self.<one of them>``."""
    if isinstance(node, ast.Name):
        return node.id in STATE_NAMES
    return (
        isinstance(node, ast.Attribute)
        and node.attr in STATE_NAMES
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _used(node: ast.AST) -> set[str]:
    """Attribute names used on the partition's state anywhere under ``node``."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and _state_base(n.value)}


def state_attributes() -> dict[str, set[str]]:
    """``{collaborator: attribute names it uses on the partition's state}``. A collaborator is
    a class whose methods name the state ``self.p`` or ``self.m`` (``module.Class``), or a
    module's functions that take it as their first argument, ``p`` or ``m`` (``module``)."""
    out: dict[str, set[str]] = {}
    for name, path in modules().items():
        short = name.removeprefix(PACKAGE + ".")
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                used = _used(node)
                if used:
                    out[f"{short}.{node.name}"] = used
            elif isinstance(node, ast.FunctionDef) and node.args.args and node.args.args[0].arg in STATE_NAMES:
                out.setdefault(short, set()).update(_used(node))
    return out


def main() -> int:
    sizes = {name: lines(path) for name, path in modules().items()}
    largest = max(sizes, key=lambda n: sizes[n])
    found = circles(import_graph())
    print(f"engine modules: {len(sizes)}, {sum(sizes.values())} lines")
    print(f"largest: {largest} ({sizes[largest]} lines); over 400: {sum(1 for v in sizes.values() if v > 400)}")
    print(f"import circles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(c.removeprefix(PACKAGE + ".") for c in component))
    print()
    print(f"{'module':<22} {'lines':>5}")
    for name in sorted(sizes):
        print(f"{name.removeprefix(PACKAGE + '.') or '__init__':<22} {sizes[name]:>5}")
    print()
    print(f"{'collaborator':<32} {'state attributes':>16}  names")
    for who, attrs in sorted(state_attributes().items()):
        print(f"{who:<32} {len(attrs):>16}  {' '.join(sorted(attrs))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
