"""Every fixture of the suite is defined once: a name defined in two modules means two things
under one name, and a test reads the one its module happens to see. A module that needs
another thing gives it a name of its own."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.source_trees import parse

TESTS = Path(__file__).resolve().parents[1]


def _fixture_name(node: ast.FunctionDef) -> str | None:
    """The fixture name a ``@pytest.fixture`` (or ``@pytest.fixture(name=...)``) gives ``node``."""
    for decorator in node.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        target = call.func if call else decorator
        if ast.unparse(target) not in ("pytest.fixture", "fixture"):
            continue
        for keyword in call.keywords if call else ():
            if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
        return node.name
    return None


def fixtures_defined(root: Path) -> dict[str, list[str]]:
    """Each fixture name under ``root`` and where it is defined (``path:line``)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.FunctionDef) and (name := _fixture_name(node)):
                found[name].append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_every_fixture_name_is_defined_once():
    found = fixtures_defined(TESTS)
    assert len(found) > 50  # (the scan sees the suite's fixtures)
    twice = {name: places for name, places in found.items() if len(places) > 1}
    assert not twice, twice


def test_the_scan_sees_a_fixture_defined_twice(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("import pytest\n\n@pytest.fixture\ndef sample():\n    pass\n")
    (tmp_path / "tests" / "test_b.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='module', name='sample')\ndef another():\n    pass\n"
    )
    assert fixtures_defined(tmp_path / "tests") == {"sample": ["tests/test_a.py:4", "tests/test_b.py:4"]}
