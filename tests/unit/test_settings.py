"""Settings come from the environment; production refuses an unsafe configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


_OWN = ("MQ_ENV", "DEBUG", "SECRET_KEY", "SECRET_KEY_FILE", "CLUSTER_SECRET", "CLUSTER_SECRET_FILE", "KV_URL")
_OWN += ("ALLOWED_HOSTS", "MQ_DATA_DIR", "NODE_ADDRESS")
_PRINT = "import django; django.setup(); from django.conf import settings; print(settings.KV_URL, settings.DEBUG)"
_SECRET = "import django; django.setup(); from django.conf import settings; print(settings.CLUSTER_SECRET)"


def _start(env: dict[str, str], code: str, data_dir: Path) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if k not in _OWN}
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", "MQ_DATA_DIR": str(data_dir), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _load(env: dict[str, str], data_dir: Path, code: str = _PRINT) -> subprocess.CompletedProcess:
    proc = _start(env, code, data_dir)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


_PROD = {"MQ_ENV": "production", "SECRET_KEY": "s" * 50, "CLUSTER_SECRET": "c" * 50, "ALLOWED_HOSTS": "mq.example"}


@pytest.mark.parametrize(
    "env, complaint",
    [
        ({**_PROD, "DEBUG": "1"}, "DEBUG"),
        ({"MQ_ENV": "production", "CLUSTER_SECRET": "c" * 50, "ALLOWED_HOSTS": "mq.example"}, "SECRET_KEY"),
        # production never makes up a cluster secret, nor reuses SECRET_KEY as one
        ({"MQ_ENV": "production", "SECRET_KEY": "s" * 50, "ALLOWED_HOSTS": "mq.example"}, "CLUSTER_SECRET"),
        ({**_PROD, "CLUSTER_SECRET": "s" * 50}, "CLUSTER_SECRET must differ from SECRET_KEY"),
        ({"SECRET_KEY": "k" * 50, "CLUSTER_SECRET": "k" * 50}, "CLUSTER_SECRET must differ from SECRET_KEY"),
        ({"CLUSTER_SECRET": "embedded-insecure-secret-change-me"}, "CLUSTER_SECRET must differ"),
        ({key: v for key, v in _PROD.items() if key != "ALLOWED_HOSTS"}, "ALLOWED_HOSTS"),
        ({"MQ_ENV": "staging"}, "MQ_ENV"),
        ({"DEBUG": "maybe"}, "DEBUG"),
        ({"KV_MIN_REPLICAS": "-1"}, "KV_MIN_REPLICAS"),
        ({"CLUSTER_CLOCK_SKEW": "0"}, "CLUSTER_CLOCK_SKEW"),
        ({"RATE_HISTORY_STEP": "0.001"}, "RATE_HISTORY_STEP"),
        ({"RATE_HISTORY_STEP": "nan"}, "RATE_HISTORY_STEP"),
        ({"RATE_HISTORY_STEP": "inf"}, "RATE_HISTORY_STEP"),
        ({"RATE_HISTORY_STEP": "1", "RATE_HISTORY_SECONDS": "3600"}, "1440"),
    ],
)
def test_refuses_to_start(env, complaint, tmp_path):
    result = _load(env, tmp_path)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and complaint in result.stderr


def test_production_starts_when_configured(tmp_path):
    result = _load({**_PROD, "KV_URL": "file:///tmp/mq-settings-test"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["file:///tmp/mq-settings-test", "False"]
    assert not (tmp_path / "cluster-secret").exists()  # given one: nothing generated


def test_an_unset_cluster_secret_is_generated_once_private_and_kept(tmp_path):
    # given a data folder without a secret, and eight processes starting on it at once
    procs = [_start({}, _SECRET, tmp_path) for _ in range(8)]
    # when they load the settings
    outs = [p.communicate(timeout=60) for p in procs]
    # then they all use one secret, made into the data folder, readable by its owner only
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    secrets = {out.strip() for out, _ in outs}
    path = tmp_path / "cluster-secret"
    assert len(secrets) == 1 and path.read_text().strip() in secrets
    secret = secrets.pop()
    assert len(secret) >= 48 and secret != "embedded-insecure-secret-change-me"
    assert path.stat().st_mode & 0o777 == 0o600
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".cluster-secret")]  # no temporary left
    # and a restart reads it back; another data folder gets another secret
    assert _load({}, tmp_path, _SECRET).stdout.strip() == secret
    other = _load({}, tmp_path / "other", _SECRET)
    assert other.returncode == 0 and other.stdout.strip() not in ("", secret)


def test_allowed_hosts_default_to_loopback_in_the_embedded_mode(tmp_path):
    code = "import django; django.setup(); from django.conf import settings; print(settings.ALLOWED_HOSTS)"
    assert _load({}, tmp_path, code).stdout.strip() == "['localhost', '127.0.0.1', '[::1]']"
    advertised = _load({"NODE_ADDRESS": "mq-3.internal:8000"}, tmp_path, code).stdout.strip()
    assert advertised == "['localhost', '127.0.0.1', '[::1]', 'mq-3.internal']"
    assert (
        _load({"ALLOWED_HOSTS": "a.example,b.example"}, tmp_path, code).stdout.strip() == "['a.example', 'b.example']"
    )


def test_unknown_kv_scheme_fails_loudly():
    from django.core.exceptions import ImproperlyConfigured

    from queues.kv import open_store

    with pytest.raises(ImproperlyConfigured, match="unknown scheme"):
        open_store("s3://bucket/x")


def test_each_kv_scheme_opens_its_backend(tmp_path):
    from queues.kv import BACKENDS, open_store
    from queues.kv.filesystem import FileStore
    from queues.kv.memory import MemoryStore

    assert isinstance(open_store("memory://"), MemoryStore)
    store = open_store(f"file://{tmp_path}/kv")
    assert isinstance(store, FileStore)
    store.close()
    # the aliases share one factory; the network backends are opened by the integration suite
    assert BACKENDS["redis"] is BACKENDS["rediss"] is BACKENDS["unix"]
    assert BACKENDS["redis-cluster"] is BACKENDS["rediss-cluster"]
    assert BACKENDS["postgres"] is BACKENDS["postgresql"] is BACKENDS["sql"]


# --- production hardening -------------------------------------------------------------------
_PRODUCTION = {
    "MQ_ENV": "production",
    "SECRET_KEY": "k3y-" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_+=!@#$%^&*()",
    "CLUSTER_SECRET": "cl-" + "ZyXwVuTsRqPoNmLkJiHgFeDcBa9876543210_-+=",
    "ALLOWED_HOSTS": "mq.example.com",
    "KV_URL": "file:///tmp/mq-settings-test",
}
_SHOW = (
    "import django, json; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({k: getattr(s, k) for k in ('SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', "
    "'SECURE_HSTS_SECONDS', 'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_PROXY_SSL_HEADER', "
    "'SECURE_SSL_REDIRECT')} | {'throttles': s.REST_FRAMEWORK.get('DEFAULT_THROTTLE_CLASSES'), "
    "'rates': s.REST_FRAMEWORK.get('DEFAULT_THROTTLE_RATES')}))"
)


def _run(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("MQ_ENV", "DEBUG", *_PRODUCTION)}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings", "MQ_DATA_DIR": str(tmp_path / "data"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_has_secure_cookies_hsts_and_throttles(tmp_path):
    import json

    # when production settings load behind a TLS proxy
    result = _run(["-c", _SHOW], {**_PRODUCTION, "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https"}, tmp_path)
    # then cookies go over HTTPS only, HSTS is on, the proxy's header says what is HTTPS, and
    # the API is throttled per user and per anonymous address
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["SESSION_COOKIE_SECURE"] is True and got["CSRF_COOKIE_SECURE"] is True
    assert got["SECURE_HSTS_SECONDS"] >= 365 * 24 * 3600 and got["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert got["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert got["SECURE_SSL_REDIRECT"] is False  # nodes forward to each other over plain HTTP
    assert got["throttles"] == ["queues.http.throttles.UserRate", "queues.http.throttles.AnonRate"]
    assert got["rates"]["user"] and got["rates"]["anon"]


def test_the_embedded_mode_keeps_plain_http_working(tmp_path):
    import json

    result = _run(["-c", _SHOW], {"KV_URL": "file:///tmp/mq-settings-test"}, tmp_path)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["SESSION_COOKIE_SECURE"] is False and got["SECURE_HSTS_SECONDS"] == 0
    assert got["rates"] == {"user": None, "anon": None}


def test_a_malformed_proxy_header_fails_loudly(tmp_path):
    result = _run(["-c", _SHOW], {**_PRODUCTION, "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"}, tmp_path)
    assert result.returncode != 0 and "SECURE_PROXY_SSL_HEADER" in result.stderr


@pytest.mark.parametrize("redirect", ["0", "1"])
def test_check_deploy_has_no_cookie_or_hsts_warnings_in_production(tmp_path, redirect):
    # when Django's deployment checklist runs on the production settings
    result = _run(["manage.py", "check", "--deploy"], {**_PRODUCTION, "SECURE_SSL_REDIRECT": redirect}, tmp_path)
    out = result.stdout + result.stderr
    # then none of the cookie and HSTS warnings remain
    for check in ("security.W004", "security.W005", "security.W012", "security.W016", "security.W009"):
        assert check not in out, out
    # and the HTTPS redirect is one only when asked for (see SECURE_SSL_REDIRECT in the settings)
    assert ("security.W008" in out) == (redirect == "0"), out
