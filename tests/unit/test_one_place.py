"""Each rule and limit of the queue's settings and calls is written once and imported where
it is needed: a second copy would drift from the first."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.source_trees import parse

ROOT = Path(__file__).resolve().parents[2]
#: The server's own code. Not the SQS wire (SQS's own bounds) nor the client SDK (it imports
#: nothing of the server).
PACKAGES = ("queues", "archive", "workers", "consoles", "config")
SKIP: set[str] = set()


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in rel and rel not in SKIP:
                yield rel, parse(path, rel)


MODULES = dict(_modules())


def _where_string(text: str) -> list[str]:
    return sorted(
        rel
        for rel, tree in MODULES.items()
        if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and text in n.value for n in ast.walk(tree))
    )


def _where_assigned(name: str) -> list[str]:
    return sorted(
        rel
        for rel, tree in MODULES.items()
        for n in tree.body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
    )


def test_the_dead_letter_rules_are_written_once():
    for text in ("go together", "its own dead-letter queue"):
        where = _where_string(text)
        assert len(where) == 1, where


def test_partitions_only_grow_is_written_once():
    where = _where_string("partitions can only grow")
    assert len(where) == 1, where


def test_the_batch_limits_are_set_once():
    for name in ("MAX_BATCH", "MAX_WAIT"):
        where = _where_assigned(name)
        assert len(where) == 1, (name, where)
    assert _where_assigned("MAX_DEQUEUE") == []  # a dequeue's limit is MAX_BATCH


def test_the_queue_settings_are_listed_once():
    """A list naming a queue's settings by hand (three of them are enough to tell)."""
    settings = {"block_size", "lease_period", "max_message_size"}

    def lists_them(node: ast.AST) -> bool:
        if not isinstance(node, (ast.List, ast.Tuple)):
            return False
        names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
        return settings <= names

    where = sorted(rel for rel, tree in MODULES.items() if any(lists_them(n) for n in ast.walk(tree)))
    assert len(where) == 1, where


def test_iso_times_are_formatted_in_one_module():
    """``.isoformat(...)`` with its ``+00:00`` made a ``Z``: the API's time format."""

    def formats(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "replace"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Attribute)
            and node.func.value.func.attr == "isoformat"
        )

    where = sorted(rel for rel, tree in MODULES.items() if any(formats(n) for n in ast.walk(tree)))
    assert len(where) == 1, where
