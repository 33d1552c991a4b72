"""``parse(path)``: a module's syntax tree, for the tests that read the project's own source.

CPython 3.11 builds syntax trees with process-wide state, so a tree built while another thread
builds one (a server thread formatting a traceback does: 3.11's traceback module parses the
failing line) fails with ``SystemError: AST constructor recursion depth mismatch``
(python/cpython#106905). The tree itself is not wrong, only the depth bookkeeping, so building it
again is safe; a lock would not help, since the other thread does not take it.
"""

from __future__ import annotations

import ast
from pathlib import Path

_TRIES = 5


def parse(path: Path, filename: str | None = None) -> ast.Module:
    """The syntax tree of the Python file at ``path`` (``filename`` names it in errors)."""
    source, name = path.read_text(), filename or str(path)
    for _ in range(_TRIES - 1):
        try:
            return ast.parse(source, name)
        except SystemError:
            continue
    return ast.parse(source, name)
