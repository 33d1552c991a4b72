"""The partition engine stays in small modules that import one another one way only: no
import circle among ``queues.engine``'s modules (those under ``if TYPE_CHECKING:`` and inside
functions count too), and none over 400 lines. ``scripts/engine_shape.py`` reads the source
and prints the figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def _shape():
    spec = importlib.util.spec_from_file_location("engine_shape", REPO / "scripts" / "engine_shape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shape = _shape()


def test_the_graph_sees_every_kind_of_import():
    # given the engine's import graph
    graph = shape.import_graph()
    # then it holds the modules, and an import under TYPE_CHECKING is an edge like any other
    assert "queues.engine.partition" in graph and "queues.engine.keys" in graph
    assert "queues.engine.ids" in graph["queues.engine.body_cache"]  # from queues.engine.ids import ...
    assert "queues.engine.keys" in graph["queues.engine.archive_journal"]  # from queues.engine import keys


def test_a_circle_is_found_when_there_is_one():
    # given a graph with a circle of three beside a chain
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    # then that circle, and only it, is reported
    assert shape.circles(graph) == [["a", "b", "c"]]
    assert shape.circles({"a": {"b"}, "b": set()}) == []


def test_the_engine_has_no_import_circle():
    # given every import of every engine module, type-only ones included
    found = shape.circles(shape.import_graph())
    # then no module reaches itself
    assert found == [], f"import circles in queues.engine: {found}"


def test_no_engine_module_is_over_400_lines():
    # given the engine's modules
    sizes = {name: shape.lines(path) for name, path in shape.modules().items()}
    # then each is small enough to read whole
    too_big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not too_big, f"engine modules over {MAX_LINES} lines: {too_big}"


#: The partition manager's collaborators (``queues.engine.partition`` wires them).
COLLABORATORS = ("acks", "delivery", "figures", "ordering", "retention", "takeover", "topic_retention", "writer")


def test_collaborators_import_neither_the_manager_nor_each_other():
    # given the engine's import graph
    graph = shape.import_graph()
    names = {f"queues.engine.{c}" for c in COLLABORATORS}
    for name in sorted(names):
        # then a collaborator reaches the state and its fellows only through queues.engine.ports
        reached = graph[name] & (names | {"queues.engine.partition", "queues.engine.state"})
        assert not reached, f"{name} imports {sorted(reached)}"
