"""Split the test modules into shards of about equal time, for ``make test`` (scripts/test.sh).

    python scripts/test_shards.py plan N [DIR]    the modules of each shard, one shard a line
    python scripts/test_shards.py record JUNIT... write tests/durations.json from junit XML files

DIR ``tests/unit`` plans ``make test-unit``'s shards by ``tests/durations-unit.json`` (its own
times, on the embedded defaults), which ``record-unit JUNIT...`` writes.

Each shard is a list of test files sorted by path, so the modules of a shard run in the order
they would in one run of the whole suite. Modules are placed largest first, each on the shard
with the least time so far (the longest-processing-time rule); a module missing from
``tests/durations.json`` counts as ``UNKNOWN_SECONDS``. Standard library only: it runs before
the venv is on PATH.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DURATIONS = REPO / "tests" / "durations.json"
#: ``make test-unit``'s times (tests/unit on the embedded defaults).
UNIT_DURATIONS = REPO / "tests" / "durations-unit.json"
#: The seconds a module without a recorded time is taken to need (a new module: about a small
#: integration module's).
UNKNOWN_SECONDS = 5.0


def modules(under: str = "tests") -> list[str]:
    """Every test file under ``under`` (``tests/``), as a path relative to the repository."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / under).rglob("test_*.py"))


def plan(shards: int, under: str = "tests") -> list[list[str]]:
    """``shards`` lists of the test files under ``under`` whose recorded times are about equal."""
    times = UNIT_DURATIONS if under.rstrip("/") == "tests/unit" else DURATIONS
    known: dict[str, float] = json.loads(times.read_text()) if times.exists() else {}
    unknown = UNKNOWN_SECONDS if times is DURATIONS else 1.0
    load = [0.0] * shards
    out: list[list[str]] = [[] for _ in range(shards)]
    for module in sorted(modules(under), key=lambda m: (-known.get(m, unknown), m)):
        i = min(range(shards), key=lambda k: (load[k], k))
        load[i] += known.get(module, unknown)
        out[i].append(module)
    return [sorted(shard) for shard in out]


def record(junit_files: list[str]) -> dict[str, float]:
    """Seconds per test file (set-up, call and tear-down of its tests) in ``junit_files``."""
    seconds: Counter[str] = Counter()
    files = set(modules())
    for name in junit_files:
        for case in ET.parse(name).getroot().iter("testcase"):  # noqa: S314 - our own run's report
            parts = case.get("classname", "").split(".")
            # classname is the module's dotted path, then any test classes
            for k in range(len(parts), 0, -1):
                path = "/".join(parts[:k]) + ".py"
                if path in files:
                    seconds[path] += float(case.get("time") or 0)
                    break
    return {m: round(s, 1) for m, s in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "plan":
        for shard in plan(int(argv[1]), *argv[2:3]):
            print(" ".join(shard))
        return 0
    if len(argv) >= 2 and argv[0] in ("record", "record-unit"):
        target = DURATIONS if argv[0] == "record" else UNIT_DURATIONS
        target.write_text(json.dumps(record(argv[1:]), indent=1) + "\n")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
