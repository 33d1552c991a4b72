"""The OpenAPI schema is the contract: schemathesis finds nothing against a live node.

A node on PostgreSQL (the test database) and Redis serves its own schema; schemathesis
(pinned in requirements-dev.txt) reads it and runs every check it has (server errors, status
codes, response schemas and headers, schema-valid requests accepted and schema-violating ones
refused, authentication, unsupported methods ...) in the coverage, fuzzing and stateful
phases. The stateful phase follows the schema's OpenAPI links: create a queue, topic or
subscription, then call what takes its name; enqueue, dequeue, then ack or change the
visibility of what was received. ``tests/integration/schemathesis.toml`` holds the settings
and says why each is there.

The seed is printed (and taken from ``MQ_SCHEMA_SEED`` when set) so a failure can be
replayed: ``MQ_SCHEMA_SEED=<seed> scripts/test.sh tests/integration/test_schema_contract.py``.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from queues.testing import NodeProcess

from .nodes import local_node_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: Cases per operation and phase; with 4 workers the run takes about 1.5 minutes on 2 cores.
CASES = int(os.environ.get("MQ_SCHEMA_CASES", "20"))


@pytest.fixture
def superuser_token(transactional_db):
    """A committed token of a superuser: staff-only calls (purge, expire, release) are fuzzed too."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    user = User.objects.create_superuser(username="schemathesis", password=None)
    return Token.objects.create(user=user).key


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_schemathesis_finds_nothing(tmp_path, superuser_token, redis_client):
    seed = int(os.environ.get("MQ_SCHEMA_SEED") or random.randrange(2**31))
    print(f"schemathesis seed: {seed} (replay: MQ_SCHEMA_SEED={seed})")
    node = NodeProcess(local_node_env(tmp_path), tmp_path).start()
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                str(HERE / "schemathesis_cli.py"),
                "--config-file",
                str(HERE / "schemathesis.toml"),
                "run",
                f"{node.url}/api/schema/?format=json",
                "--header",
                f"Authorization: Token {superuser_token}",
                "--checks",
                "all",
                "--phases",
                "coverage,fuzzing,stateful",
                "--max-examples",
                str(CASES),
                "--seed",
                str(seed),
                "--workers",
                "4",
                "--suppress-health-check",
                "all",
                "--generation-database",
                "none",
                "--no-color",
            ],
            cwd=tmp_path,  # its report directory and caches stay in the test's directory
            capture_output=True,
            text=True,
            timeout=400,
        )
        elapsed = time.monotonic() - t0
    finally:
        node.stop()
    out = proc.stdout + proc.stderr
    summary = out[out.rfind("SUMMARY") :] if "SUMMARY" in out else out[-3000:]
    print(summary)
    print(f"schemathesis: {elapsed:.0f} s, seed {seed}")
    generated = re.search(r"(\d+) generated", summary)
    assert proc.returncode == 0, (
        f"schemathesis found something (seed {seed}):\n{out[-20000:]}\nnode log:\n{node.log_tail(60)}"
    )
    assert generated and int(generated.group(1)) >= 1000, summary  # it really ran
    # Every phase ran and passed; the stateful one is the links being followed.
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert re.search(rf"✅ {phase}", summary), f"{phase} phase did not pass:\n{summary}"
