#!/usr/bin/env bash
# Run a command in the repo venv with local PostgreSQL + Redis up, then stop them (always).
#
#   scripts/with-services.sh CMD [ARGS...]
#
# The command sees the variables printed by `scripts/services.sh env` plus
# DJANGO_SETTINGS_MODULE=config.settings and SPARK_LOCAL_IP=127.0.0.1.
# Exits with the command's exit code. MQ_KEEP_SERVICES=1 leaves the services running.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
[ $# -gt 0 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }

venv="$(scripts/venv.sh | tail -n 1)"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"

cleanup() {
    local rc=$?
    trap '' INT TERM            # let the shutdown finish even on a second Ctrl-C
    if [ "${MQ_KEEP_SERVICES:-0}" = 1 ]; then
        echo "with-services: MQ_KEEP_SERVICES=1, leaving services running" >&2
    else
        scripts/services.sh stop || echo "with-services: WARNING: services.sh stop failed" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

scripts/services.sh start
eval "$(scripts/services.sh env)"
export DJANGO_SETTINGS_MODULE=config.settings SPARK_LOCAL_IP=127.0.0.1

rc=0
"$@" || rc=$?
exit "$rc"
