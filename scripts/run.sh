#!/usr/bin/env bash
# `make run`: one node + one Celery worker in the foreground, embedded defaults (no services needed).
#   PORT (default 8000)        node HTTP port on 127.0.0.1
#   ADMIN_PASSWORD             password for the `admin` superuser (else a random one, shown once at creation)
# Ctrl-C (or a TERM) stops both, and this script exits 0 once they have stopped in time; if either
# exits on its own, the other is stopped too and the script exits with that code. Under `make run`
# the terminal's Ctrl-C reaches make as well: make waits for this script to stop both, then ends
# by the same signal (status 130 in the shell), printing no error.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
port="${PORT:-8000}"

venv="$(scripts/venv.sh | tail -n 1)"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
export DJANGO_SETTINGS_MODULE="${DJANGO_SETTINGS_MODULE:-config.settings}"

echo "run: migrating" >&2
python manage.py migrate --noinput

# --- the console's superuser and the applications' user and token (idempotent) ----------------
# `admin` is for the console only; the API token printed is an ordinary user's (`app`: produce and
# consume on every queue, not staff), see queues/management/commands/quickstart.py.
setup_out="$(python manage.py quickstart)"
admin_state="" admin_pw="" app_user="" token=""
read -r _ admin_state admin_pw < <(grep '^MQ_ADMIN ' <<<"$setup_out" | tail -n 1) || true
read -r _ app_user < <(grep '^MQ_APP ' <<<"$setup_out" | tail -n 1) || true
read -r _ token < <(grep '^MQ_APP_TOKEN ' <<<"$setup_out" | tail -n 1) || true
if grep -q '^MQ_ADMIN_TOKEN revoked' <<<"$setup_out"; then
    echo "run: the admin's old API token was deleted: applications use the token below" >&2
fi

bar="=================================================================="
{
    echo "$bar"
    echo "  node:      http://127.0.0.1:$port/        admin: http://127.0.0.1:$port/admin/"
    echo "  console:   user admin (superuser: the console only, no API token)"
    case "$admin_state $admin_pw" in
        "created given"|"reset given") echo "  password:  (the one in \$ADMIN_PASSWORD)" ;;
        created*) echo "  password:  $admin_pw      <- shown only this once" ;;
        *)        echo "  password:  (unchanged; set ADMIN_PASSWORD=... to reset it)" ;;
    esac
    if [ -n "$token" ]; then
        echo "  API token: $token"
        echo "             (header  Authorization: Token $token)"
        echo "             user $app_user: produce and consume on every queue; not staff"
    else
        echo "  API token: (none)"
    fi
    echo "$bar"
} >&2

# --- node + worker ------------------------------------------------------------------------------
# Each runs in its own session/process group so we can stop whole trees; Ctrl-C reaches us and
# we stop them (TERM, then KILL after a grace period; a second Ctrl-C forces it).
pids=()
names=()
stopping=0
requested=0     # 1 once Ctrl-C or TERM asked us to stop: a stop we asked for, not a failure
forced=0        # 1 if anything had to be killed

# TERM goes to the main processes only (Celery's warm shutdown manages its pool itself);
# KILL goes to the whole process groups.
signal_all() {
    local sig="$1" pid
    for pid in "${pids[@]}"; do
        if [ "$sig" = KILL ]; then
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        else
            kill "-$sig" "$pid" 2>/dev/null || true
        fi
    done
}

any_alive() {
    local pid
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done
    return 1
}

cleanup() {
    local rc=$?
    [ "$stopping" = 1 ] && return
    stopping=1
    trap 'echo "run: forcing stop" >&2; forced=1; signal_all KILL' INT
    trap '' TERM
    if [ ${#pids[@]} -gt 0 ] && any_alive; then
        echo "run: stopping ${names[*]}" >&2
        signal_all TERM
        local i
        for i in $(seq 1 100); do any_alive || break; sleep 0.2; done
        if any_alive; then
            echo "run: still running after 20s; killing" >&2
            forced=1
            signal_all KILL
        fi
    fi
    wait 2>/dev/null || true
    # Stopping on request is the normal end of `make run`: exit 0, so that make reports no
    # error. A forced stop, or one before both started, keeps the signal's code.
    if [ "$requested" = 1 ] && [ "$forced" = 0 ] && [ ${#pids[@]} -gt 0 ]; then
        echo "run: stopped" >&2
        rc=0
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'requested=1; exit 130' INT
trap 'requested=1; exit 143' TERM

start() {   # name cmd...
    names+=("$1"); shift
    setsid "$@" &
    pids+=("$!")
}

start node python manage.py runnode --host 127.0.0.1 --port "$port"
# -B: the worker also runs the beat schedule (retention, ...); one process is enough here.
data_dir="${MQ_DATA_DIR:-$repo/data}"
start worker celery -A config worker -B -l info -s "$data_dir/celerybeat-schedule"

rc=0
wait -n "${pids[@]}" || rc=$?
echo "run: a process exited (code $rc); stopping the rest" >&2
exit "$rc"
