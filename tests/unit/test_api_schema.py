"""The OpenAPI schema (``/api/schema/``, the docs pages) generates without a single warning.

drf-spectacular warns about anything it cannot describe (an authenticator without an
extension, a view whose serializer it cannot guess); ``--fail-on-warn`` turns each into a
failure here, so none comes back unnoticed. The command runs as a user would run it, in its own
process on the embedded default settings.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_schema_validates_without_warnings(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "KV_URL", "REDIS_URL", "CELERY_BROKER_URL"}}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", MQ_DATA_DIR=str(tmp_path / "data"))
    schema = tmp_path / "schema.yml"
    proc = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn", "--file", str(schema)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    text = schema.read_text()
    # The cluster peers' authentication is described, as a header carrying a signature (never the secret).
    assert "clusterSignature:" in text
    assert "name: X-MQ-Cluster-Signature" in text
    assert "X-MQ-Cluster-Secret" not in text
