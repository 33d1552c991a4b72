#!/usr/bin/env bash
# `make run` from an empty data folder N times in a row, as a user starts it: each start waits
# for healthz and the worker's first beat task (beat's default schedule: the first at ~10 s),
# then presses Ctrl-C (SIGINT to make's process group) and checks that both stopped cleanly.
#   scripts/run-starts.sh [N=20] [BASE_PORT=18400]     (ports BASE_PORT+1 .. BASE_PORT+N)
# Prints one line a start and "<ok> starts of <N>"; exits 1 unless every start was ok. The data
# folders (and each start's log) are kept under a temporary folder, named in each line.
set -u
set -m   # job control: each start in a process group of its own, SIGINT not ignored (as in a terminal)
n="${1:-20}" base="${2:-18400}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$(scripts/venv.sh | tail -n 1)"
export PATH="$venv/bin:$PATH"
unset DATABASE_URL KV_URL REDIS_URL CELERY_BROKER_URL MQ_ENV DJANGO_SETTINGS_MODULE
work="$(mktemp -d "${TMPDIR:-/tmp}/mq-starts.XXXXXX")"
ok=0
# SIGINT as a terminal leaves it: a script started in the background has it ignored, and a shell
# that starts with it ignored (run.sh) cannot trap it.
ctrl_c='import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])'
for i in $(seq 1 "$n"); do
    dir="$work/start-$i"; mkdir -p "$dir"; port=$((base + i))
    t0=$(date +%s.%N)
    MQ_DATA_DIR="$dir/data" PORT=$port python3 -c "$ctrl_c" make run >"$dir/log" 2>&1 &
    pid=$!
    state=timeout
    for _ in $(seq 1 240); do
        if ! kill -0 $pid 2>/dev/null; then state=died; break; fi
        if curl -sf "http://127.0.0.1:$port/api/v1/healthz" >/dev/null 2>&1 \
           && grep -qE 'Task (archive\.run_archiver|workers\.relay_outbox)\[[^]]+\] succeeded' "$dir/log"; then
            state=up; break
        fi
        sleep 0.5
    done
    t1=$(date +%s.%N)
    kill -INT -- -$pid 2>/dev/null
    wait $pid; rc=$?
    t2=$(date +%s.%N)
    stopped=no; grep -q '^run: stopped' "$dir/log" && stopped=yes
    bad=no; grep -qE 'JSONDecodeError|Unrecoverable error|Traceback' "$dir/log" && bad=yes
    leftover=no; curl -sf "http://127.0.0.1:$port/api/v1/healthz" >/dev/null 2>&1 && leftover=yes
    verdict=FAIL
    [ "$state" = up ] && [ "$stopped" = yes ] && [ "$bad" = no ] && [ "$leftover" = no ] && { verdict=ok; ok=$((ok + 1)); }
    printf '%2d %s: %s after %.1fs, make rc %s (130 = by SIGINT), run.sh stopped=%s, errors=%s, leftover=%s, stop %.1fs  %s\n' \
        "$i" "$verdict" "$state" "$(python3 -c "print($t1 - $t0)")" "$rc" "$stopped" "$bad" "$leftover" "$(python3 -c "print($t2 - $t1)")" "$dir"
done
echo "$ok starts of $n"
[ "$ok" = "$n" ]
