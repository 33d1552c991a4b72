#!/usr/bin/env bash
# `make test`: pytest against real PostgreSQL + Redis (started here, always stopped afterwards).
#   scripts/test.sh                          the whole suite, in MQ_TEST_SHARDS shards (default 2)
#   scripts/test.sh [PYTEST ARGS...]         e.g. scripts/test.sh -k lease -x: one pytest run
# Every run starts from empty stores: a new test database (pytest-django), the test Redis and
# Redis Cluster emptied (tests/conftest.py), and a data folder (MQ_DATA_DIR) of its own, removed
# afterwards (nothing of data/, `make run`'s, is read or written). The 25 slowest steps are
# listed at the end.
#
# The whole suite runs as shards side by side, each a pytest process with services of its own
# (PostgreSQL, Redis and the Redis Cluster on ports of its own, under .services/shard-K), its own
# data folder and its own range of node ports: no shard sees another's rows, keys or nodes. Most
# of a run is spent waiting (for a node to start, a lease to lapse, a takeover), so two shards
# on two cores take little more than half the time of one. scripts/test_shards.py splits the
# modules by the times recorded in tests/durations.json; each shard's lines are prefixed [K].
# MQ_TEST_SHARDS=1 runs the whole suite as one pytest process, as PYTEST ARGS always do.
# MQ_TEST_JUNIT_DIR=DIR writes each shard's junit XML there (`python scripts/test_shards.py
# record DIR/*.xml` then records the times the split uses).
# Exits with pytest's exit code (the first failing shard's); exit 5 (no tests) is a failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
data="$(mktemp -d "${TMPDIR:-/tmp}/mq-test.XXXXXX")"
# No test crashes the operating system, so none needs PostgreSQL's flushes to disk; on a busy
# machine one of them (a checkpoint's) held commits past a node's database deadline.
export MQ_PG_FSYNC="${MQ_PG_FSYNC:-off}"
# Redis likewise (MQ_REDIS_FSYNC in services.sh): each write reaches its append-only file as
# Redis answers it, so a killed redis-server loses none, but no call waits for the disk: on a
# disk busy with another test's writes, such a wait passed REDIS_TIMEOUT.
export MQ_REDIS_FSYNC="${MQ_REDIS_FSYNC:-no}"

REPORT_AS="make test"
# shellcheck source=scripts/report.sh
source "$here/report.sh"

shards="${MQ_TEST_SHARDS:-2}"
junit=()
if [ $# -gt 0 ] || [ "$shards" -le 1 ]; then
    trap 'rm -rf "$data"' EXIT
    export MQ_DATA_DIR="$data"
    [ -n "${MQ_TEST_JUNIT_DIR:-}" ] && junit=(--junitxml="$MQ_TEST_JUNIT_DIR/shard-0.xml")
    rc=0
    "$here/with-services.sh" python -m pytest --durations=25 "${junit[@]}" "$@" || rc=$?
    report "$rc" ""
    exit "$rc"
fi

# --- the whole suite, in shards -------------------------------------------------------------------
pg_port="${MQ_PG_PORT:-54329}"
redis_port="${MQ_REDIS_PORT:-63799}"
cluster_port="${MQ_REDIS_CLUSTER_PORT:-$((redis_port + 101))}"
svc_base="${MQ_SERVICES_DIR:-$repo/.services}"
mapfile -t plan < <(python3 "$here/test_shards.py" plan "$shards")
# What the shards share is made once, before them: the venv and the Debian packages; and each
# shard's PostgreSQL port kept from being another shard's client's local port meanwhile.
"$here/venv.sh" >/dev/null
"$here/services.sh" packages
"$here/services.sh" reserve-ports $(seq "$pg_port" $((pg_port + shards - 1)))
pgids=()
stop_shards() {
    local pgid
    for pgid in "${pgids[@]}"; do kill -TERM -- "-$pgid" 2>/dev/null || true; done
}
trap 'stop_shards; wait; rm -rf "$data"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "make test: $shards shards side by side; the modules of each:" >&2
for k in $(seq 0 $((shards - 1))); do
    echo "  [$k] ${plan[$k]}" >&2
done
pids=()
for k in $(seq 0 $((shards - 1))); do
    [ -n "${plan[$k]:-}" ] || { echo "make test: shard $k has no modules" >&2; exit 2; }
    mkdir -p "$data/shard-$k"
    [ -n "${MQ_TEST_JUNIT_DIR:-}" ] && mkdir -p "$MQ_TEST_JUNIT_DIR"
    # Each shard in a session of its own (setsid): a stop reaches its pytest, its services'
    # wrapper and the prefixing sed as one process group. Node ports: a range of its own.
    # A command started with & by a script has SIGINT ignored, and a process started with SIGINT
    # ignored passes that on: the scripts the suite Ctrl-C's (scripts/run.sh) could not trap it.
    # --default-signal=INT gives each shard SIGINT as a terminal's shell leaves it.
    # shellcheck disable=SC2016
    setsid env --default-signal=INT \
        MQ_SERVICES_DIR="$svc_base/shard-$k" \
        MQ_PG_PORT="$((pg_port + k))" \
        MQ_REDIS_PORT="$((redis_port + 10 * k))" \
        MQ_REDIS_CLUSTER_PORT="$((cluster_port + 10 * k))" \
        MQ_DATA_DIR="$data/shard-$k" \
        MQ_TEST_NODE_PORTS="$((20000 + k * 12000 / shards))-$((20000 + (k + 1) * 12000 / shards))" \
        SHARD="$k" JUNIT="${MQ_TEST_JUNIT_DIR:+$MQ_TEST_JUNIT_DIR/shard-$k.xml}" HERE="$here" \
        bash -c 'set -o pipefail
            extra=(); [ -n "$JUNIT" ] && extra=(--junitxml="$JUNIT")
            "$HERE/with-services.sh" python -m pytest --durations=25 "${extra[@]}" "$@" 2>&1 \
                | sed -u "s/^/[$SHARD] /"' shard-"$k" ${plan[$k]} &
    pids+=("$!")
    pgids+=("$!")
done
rc=0
for k in $(seq 0 $((shards - 1))); do
    shard_rc=0
    wait "${pids[$k]}" || shard_rc=$?
    report "$shard_rc" "shard $k: "
    [ "$rc" = 0 ] && rc="$shard_rc"
done
pgids=()
[ "$rc" = 0 ] && echo "make test: every shard passed" >&2
exit "$rc"
