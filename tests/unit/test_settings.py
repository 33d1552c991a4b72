"""Settings come from the environment; production refuses an unsafe configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("MQ_ENV", "DEBUG", "SECRET_KEY", "CLUSTER_SECRET", "KV_URL")
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.KV_URL, settings.DEBUG)",
        ],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "env, complaint",
    [
        ({"MQ_ENV": "production", "DEBUG": "1", "SECRET_KEY": "s" * 50, "CLUSTER_SECRET": "c" * 50}, "DEBUG"),
        ({"MQ_ENV": "production", "CLUSTER_SECRET": "c" * 50}, "SECRET_KEY"),
        ({"MQ_ENV": "staging"}, "MQ_ENV"),
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"KV_MIN_REPLICAS": "-1"}, "KV_MIN_REPLICAS"),
    ],
)
def test_refuses_to_start(env, complaint):
    result = _load(env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and complaint in result.stderr


def test_production_starts_when_configured():
    result = _load(
        {
            "MQ_ENV": "production",
            "SECRET_KEY": "s" * 50,
            "CLUSTER_SECRET": "c" * 50,
            "KV_URL": "file:///tmp/mq-settings-test",
        }
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["file:///tmp/mq-settings-test", "False"]


def test_unknown_kv_scheme_fails_loudly():
    from django.core.exceptions import ImproperlyConfigured

    from queues.kv import open_store

    with pytest.raises(ImproperlyConfigured, match="unknown scheme"):
        open_store("s3://bucket/x")
