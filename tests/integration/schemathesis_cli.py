"""``python tests/integration/schemathesis_cli.py ARGS``: schemathesis' ``st`` with one fix.

schemathesis runs its workers in threads; Hypothesis describes a filtered strategy by parsing
its source with ``ast.parse``, and CPython 3.11 builds the tree with process-wide state: two
threads parsing at once fail with "AST constructor recursion depth mismatch" (a SystemError
reported as a run error). One lock around ``ast.parse`` makes it safe; nothing else changes.
"""

from __future__ import annotations

import ast
import threading

_lock = threading.RLock()
_parse = ast.parse


def _locked_parse(*args, **kwargs):
    with _lock:
        return _parse(*args, **kwargs)


ast.parse = _locked_parse

from schemathesis.cli import schemathesis  # noqa: E402 - after the fix, so every import sees it

if __name__ == "__main__":
    schemathesis(prog_name="st")
