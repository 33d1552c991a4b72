"""A module no task message may make a worker import (tests/integration/test_django_tasks.py).

Importing it writes the file ``MQ_TEST_IMPORTED`` names, as a module's import-time code would
do anything else (register a node, open connections...); its function is what an old worker
would have run for a message naming ``tests.integration.imported_by_name.run``.
"""

import os
from pathlib import Path

if os.environ.get("MQ_TEST_IMPORTED"):
    Path(os.environ["MQ_TEST_IMPORTED"]).write_text(f"imported by process {os.getpid()}\n")


def run():
    return "ran"
