#!/usr/bin/env bash
# `make test`: pytest against real PostgreSQL + Redis (started here, always stopped afterwards).
#   scripts/test.sh [PYTEST ARGS...]        e.g. scripts/test.sh -k lease -x
# Every run starts from empty stores: a new test database (pytest-django), the test Redis and
# Redis Cluster emptied (tests/conftest.py), and a data folder (MQ_DATA_DIR) of its own, removed
# afterwards (nothing of data/, `make run`'s, is read or written). The 25 slowest steps are
# listed at the end. Exits with pytest's exit code; exit 5 (no tests collected) is a failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="$(mktemp -d "${TMPDIR:-/tmp}/mq-test.XXXXXX")"
trap 'rm -rf "$data"' EXIT
export MQ_DATA_DIR="$data"
# No test crashes the operating system, so none needs PostgreSQL's flushes to disk; on a busy
# machine one of them (a checkpoint's) held commits past a node's database deadline.
export MQ_PG_FSYNC="${MQ_PG_FSYNC:-off}"
# Redis likewise (MQ_REDIS_FSYNC in services.sh): each write reaches its append-only file as
# Redis answers it, so a killed redis-server loses none, but no call waits for the disk: on a
# disk busy with another test's writes, such a wait passed REDIS_TIMEOUT.
export MQ_REDIS_FSYNC="${MQ_REDIS_FSYNC:-no}"
rc=0
"$here/with-services.sh" python -m pytest --durations=25 "$@" || rc=$?
case "$rc" in
    0) ;;
    5) echo "make test: FAILED: pytest collected no tests (exit 5)" >&2 ;;
    *) echo "make test: FAILED (pytest exit code $rc)" >&2 ;;
esac
exit "$rc"
