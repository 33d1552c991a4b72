#!/usr/bin/env bash
# `make test-unit`: tests/unit on the embedded defaults (SQLite, the filesystem store): no
# PostgreSQL, no Redis, well under a minute. Tests marked `slow` (the Spark transforms start a
# JVM; the O(log N) tree walk) are left to `make test`; `ARGS="-m ''"` runs them too.
#   scripts/test-unit.sh                     in MQ_TEST_UNIT_SHARDS shards side by side (default 2)
#   scripts/test-unit.sh [PYTEST ARGS...]    one pytest run (as MQ_TEST_UNIT_SHARDS=1)
# Much of a unit run waits (threads, timers, a subprocess), so two pytest processes, each with a
# data folder of its own and the modules split by tests/durations-unit.json
# (scripts/test_shards.py plan N tests/unit), take little more than half the time of one.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$(scripts/venv.sh | tail -n 1)"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
# The embedded defaults, whatever the shell has exported for services.
unset DATABASE_URL KV_URL REDIS_URL CELERY_BROKER_URL CELERY_RESULT_BACKEND MQ_TEST_PG_URL MQ_TEST_REDIS_URL MQ_TEST_REDIS_CLUSTER_URL
data="$(mktemp -d "${TMPDIR:-/tmp}/mq-unit.XXXXXX")"
trap 'rm -rf "$data"' EXIT
export DJANGO_SETTINGS_MODULE=config.settings SPARK_LOCAL_IP=127.0.0.1

REPORT_AS="make test-unit"
# shellcheck source=scripts/report.sh
source "$repo/scripts/report.sh"

shards="${MQ_TEST_UNIT_SHARDS:-2}"
if [ $# -gt 0 ] || [ "$shards" -le 1 ]; then
    rc=0
    MQ_DATA_DIR="$data" python -m pytest tests/unit -m "not slow" "$@" || rc=$?
    report "$rc" ""
    exit "$rc"
fi

mapfile -t plan < <(python3 scripts/test_shards.py plan "$shards" tests/unit)
pids=()
for k in $(seq 0 $((shards - 1))); do
    [ -n "${plan[$k]:-}" ] || continue
    mkdir -p "$data/shard-$k"
    # shellcheck disable=SC2086  # (the plan's paths: one word each)
    (set -o pipefail; MQ_DATA_DIR="$data/shard-$k" python -m pytest -m "not slow" -p no:cacheprovider ${plan[$k]} 2>&1 \
        | sed -u "s/^/[$k] /") &
    pids+=("$!")
done
rc=0
for k in "${!pids[@]}"; do
    shard_rc=0
    wait "${pids[$k]}" || shard_rc=$?
    report "$shard_rc" "shard $k: "
    [ "$rc" = 0 ] && rc="$shard_rc"
done
[ "$rc" = 0 ] && echo "make test-unit: every shard passed" >&2
exit "$rc"
