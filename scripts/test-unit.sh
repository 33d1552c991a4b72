#!/usr/bin/env bash
# `make test-unit`: tests/unit on the embedded defaults (SQLite, the filesystem store): no
# PostgreSQL, no Redis, well under a minute. Tests marked `slow` (the Spark transforms start a
# JVM; the O(log N) tree walk) are left to `make test`; `ARGS="-m ''"` runs them too.
#   scripts/test-unit.sh [PYTEST ARGS...]
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$(scripts/venv.sh | tail -n 1)"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
# The embedded defaults, whatever the shell has exported for services.
unset DATABASE_URL KV_URL REDIS_URL CELERY_BROKER_URL CELERY_RESULT_BACKEND MQ_TEST_PG_URL MQ_TEST_REDIS_URL MQ_TEST_REDIS_CLUSTER_URL
data="$(mktemp -d "${TMPDIR:-/tmp}/mq-unit.XXXXXX")"
trap 'rm -rf "$data"' EXIT
export MQ_DATA_DIR="$data" DJANGO_SETTINGS_MODULE=config.settings SPARK_LOCAL_IP=127.0.0.1

rc=0
python -m pytest tests/unit -m "not slow" "$@" || rc=$?
case "$rc" in
    0) ;;
    5) echo "make test-unit: FAILED: pytest collected no tests (exit 5)" >&2 ;;
    *) echo "make test-unit: FAILED (pytest exit code $rc)" >&2 ;;
esac
exit "$rc"
