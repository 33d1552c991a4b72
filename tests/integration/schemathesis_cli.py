"""``python tests/integration/schemathesis_cli.py ARGS``: schemathesis' ``st`` with one fix.

schemathesis runs its workers in threads; Hypothesis describes a filtered strategy by parsing
its source with ``ast.parse``, which on CPython 3.11 is not safe in concurrent threads
("AST constructor recursion depth mismatch", a SystemError reported as a run error). One lock
around that description makes it safe; nothing else of schemathesis changes.
"""

from __future__ import annotations

import threading

from hypothesis.internal import lambda_sources
from schemathesis.cli import schemathesis

_lock = threading.Lock()
_describe = lambda_sources._lambda_description


def _locked_description(*args, **kwargs):
    with _lock:
        return _describe(*args, **kwargs)


lambda_sources._lambda_description = _locked_description

if __name__ == "__main__":
    schemathesis(prog_name="st")
