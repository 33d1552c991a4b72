"""Every package of the project is under mypy strict (``make lint``), with nothing exempt: no
package left out of ``files``, no ``ignore_errors`` override, no file-level ``mypy:
ignore-errors`` and no ``type: ignore`` without the error code it silences."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MYPY = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
#: The project's packages: every top-level folder with an ``__init__.py``, the tests aside.
PACKAGES = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")


def test_every_package_is_checked_strictly() -> None:
    assert MYPY["strict"] is True
    assert sorted(MYPY["files"]) == PACKAGES
    exempt = [o["module"] for o in MYPY.get("overrides", []) if o.get("ignore_errors")]
    assert exempt == []


def test_no_silenced_error_without_its_code() -> None:
    unsaid = re.compile(r"type:\s*ignore(?!\[)|mypy:\s*ignore-errors")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if unsaid.search(line)
    ]
    assert found == []
