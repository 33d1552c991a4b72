"""docs/reference/configuration.md names every setting the code reads, and only those.

The settings ``config/settings.py`` reads are found in its source (the first argument of its
``env*`` readers and of ``os.environ.get``; ``NAME_FILE`` too where a secret may come from a
file), so a new setting fails this test until the page documents it. A variable the page
names in the first column of a table must be read somewhere: by ``settings.py``, or as a
string literal in the service's own packages (the SDK, the workers, the archiver ...).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.source_trees import parse

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "configuration.md"
SETTINGS = REPO / "config" / "settings.py"
PACKAGES = ("config", "queues", "sqs", "workers", "consoles", "archive", "mq_client")
READERS = {"env", "envbool", "envint", "envfloat", "envsecret", "envnetworks"}
NAME = re.compile(r"`([A-Z][A-Z0-9_]*[A-Z0-9])`")


def _first_string(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def settings_read() -> set[str]:
    """The environment variables settings.py reads."""
    names: set[str] = set()
    for node in ast.walk(parse(SETTINGS)):
        if isinstance(node, ast.Call):
            name = _first_string(node)
            if name is None:
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in READERS:
                names.add(name)
                if func.id == "envsecret":
                    names.add(f"{name}_FILE")
            elif isinstance(func, ast.Attribute) and func.attr == "get" and ast.unparse(func.value) == "os.environ":
                names.add(name)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Constant)
            and any(ast.unparse(c) == "os.environ" for c in node.comparators)
        ):
            names.add(str(node.left.value))
    # The readers themselves read their argument: not a setting.
    names.discard("name")
    return names


def documented() -> set[str]:
    """The variables named in the first column of the page's tables."""
    names: set[str] = set()
    for line in PAGE.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names.update(NAME.findall(first))
    return names


def read_in_code(name: str) -> bool:
    literal = re.compile(rf"""["']{re.escape(name)}["']""")
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if literal.search(path.read_text()):
                return True
    return False


def test_the_readers_are_found() -> None:
    read = settings_read()
    # A sample of each reader, so that a change to settings.py's style cannot empty the set.
    assert {"MQ_ENV", "DEBUG", "NODE_THREADS", "NODE_HEARTBEAT", "SECRET_KEY_FILE", "METRICS_ALLOW"} <= read
    assert {"MQ_DATA_DIR", "SQLITE_TEST_NAME", "ALLOWED_HOSTS"} <= read


def test_every_setting_is_documented() -> None:
    missing = sorted(settings_read() - documented())
    assert not missing, f"read by config/settings.py, not in {PAGE.relative_to(REPO)}: {missing}"


def test_every_documented_setting_is_read() -> None:
    read = settings_read()
    unknown = sorted(n for n in documented() - read if not read_in_code(n))
    assert not unknown, f"in {PAGE.relative_to(REPO)}, read by no code: {unknown}"
