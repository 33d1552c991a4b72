#!/usr/bin/env bash
# Local PostgreSQL + Redis for integration tests and benchmarks.
#
#   scripts/services.sh start | stop | restart | status | env
#   scripts/services.sh packages             # install the Debian packages the others need, if missing
#   scripts/services.sh redis-replica start|stop|status PORT   # a replica of the main Redis
#   scripts/services.sh redis-cluster start|stop|status        # the three-primary Redis Cluster
#   scripts/services.sh redis-restart        # SIGKILL the Redis, start it again: only its AOF survives
#   scripts/services.sh redis-cluster-restart PORT   # the same for one primary of the Redis Cluster
#   scripts/services.sh pg-restart           # pg_ctl restart -m fast (every connection is cut)
#   scripts/services.sh pause redis|pg SECS  # SIGSTOP the server for SECS, then SIGCONT: it is
#                                            # unreachable (connections hang, nothing is refused)
#   scripts/services.sh reserve-ports PORT... # keep PORTs out of the kernel's ephemeral range
#                                            # (ip_local_reserved_ports), where this user may
#
# Env: MQ_SERVICES_DIR (default <repo>/.services), MQ_PG_PORT (54329), MQ_REDIS_PORT (63799),
#      MQ_REDIS_CLUSTER_PORT (MQ_REDIS_PORT + 101: 63900 by default): the cluster's three
#      primaries listen on it and the next two ports, their cluster bus on the three after
#      (63900-63905 by default; a worktree with its own MQ_REDIS_PORT gets its own cluster),
#      MQ_SERVICES_TIMEOUT (seconds to wait for readiness, default 30), MQ_PG_FSYNC (on; the
#      test suite sets off: a commit still reaches the operating system before it returns, so a
#      killed server or client loses nothing, but no test waits on a disk flush or a checkpoint's),
#      MQ_REDIS_FSYNC (Redis's appendfsync: always or no; always by default; the test suite
#      sets no: Redis still writes each change to its append-only file in the same turn of its
#      event loop as it answers (with always, strictly before), so a killed redis-server loses
#      none (but for that turn's microseconds), yet no call waits on the disk; everysec is not
#      taken: it holds writes back, answered, while a flush is slow),
#      MQ_SERVICES_HOST (an address of this machine that PostgreSQL and Redis listen on besides
#      127.0.0.1, e.g. the stores' address of a nemesis run's network namespaces; unset by
#      default), MQ_SERVICES_CLIENTS (with MQ_SERVICES_HOST: the addresses PostgreSQL accepts
#      password logins from on it, a pg_hba.conf address; default samenet: the subnets of this
#      machine's interfaces, those of the namespaces' bridge included). The Redis Cluster's
#      nodes listen on it too and announce it to their clients (CLUSTER SLOTS) instead of
#      127.0.0.1: a cluster made with it is reached on it, from the namespaces and from here.
# Every server listens on 127.0.0.1 (and on MQ_SERVICES_HOST when set); `start` starts the cluster too, `stop` stops it. PostgreSQL runs as the `postgres` user when we are root.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
svc="${MQ_SERVICES_DIR:-$repo/.services}"
pg_port="${MQ_PG_PORT:-54329}"
redis_port="${MQ_REDIS_PORT:-63799}"
cluster_port="${MQ_REDIS_CLUSTER_PORT:-$((redis_port + 101))}"
timeout="${MQ_SERVICES_TIMEOUT:-30}"
services_host="${MQ_SERVICES_HOST:-}"
services_clients="${MQ_SERVICES_CLIENTS:-samenet}"
listen="127.0.0.1${services_host:+,$services_host}"   # PostgreSQL's listen_addresses

pgdata="$svc/pg"
pgrun="$svc/pg-run"
pglog="$svc/pg.log"
rdir="$svc/redis"

log() { echo "services: $*" >&2; }
die() { echo "services: ERROR: $*" >&2; exit 1; }
case "${MQ_REDIS_FSYNC:-always}" in
    always|no) ;;
    *) die "MQ_REDIS_FSYNC must be always or no, not '$MQ_REDIS_FSYNC'" ;;
esac

# ---------------------------------------------------------------- packages

pkg_installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

ensure_packages() {
    local missing=() p
    # faketime: the nemesis run's clock drift (libfaketime); gcc and libc6-dev build its timed-wait
    # companion library (nemesis/faketime_waits.c)
    for p in postgresql redis-server chromium chromium-driver libpostgresql-jdbc-java faketime gcc libc6-dev; do
        pkg_installed "$p" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "missing packages: ${missing[*]} (not root, no sudo)"
        sudo=(sudo)
    fi
    log "installing missing Debian packages: ${missing[*]}"
    "${sudo[@]}" apt-get update >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}" >&2
}

pg_bindir() {
    local d
    for d in /usr/lib/postgresql/15/bin $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
        [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
    done
    command -v pg_config >/dev/null && [ -x "$(pg_config --bindir)/pg_ctl" ] && { pg_config --bindir; return 0; }
    die "PostgreSQL server binaries not found (expected /usr/lib/postgresql/15/bin)"
}

# ---------------------------------------------------------------- postgres

pg_user=""      # set by pg_setup_vars: the OS user the server runs as
as_pg() {       # run a command as the PostgreSQL OS user
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_setup_vars() {
    PGBIN="$(pg_bindir)"
    if [ "$(id -u)" -eq 0 ]; then
        id postgres >/dev/null 2>&1 || die "user 'postgres' does not exist (is the postgresql package installed?)"
        pg_user=postgres
    else
        pg_user="$(id -un)"
    fi
}

# pid of the postmaster if it is really running for $pgdata, else empty (stale/no postmaster.pid).
pg_pid() {
    local pid
    [ -f "$pgdata/postmaster.pid" ] || return 0
    pid="$(head -n1 "$pgdata/postmaster.pid" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    [ -d "/proc/$pid" ] || return 0
    # A recycled pid belonging to something else does not count.
    case "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" in
        */postgres|*/postgres\ \(deleted\)) ;;
        *) return 0 ;;
    esac
    [ "$(readlink "/proc/$pid/cwd" 2>/dev/null || true)" = "$(readlink -f "$pgdata")" ] || return 0
    echo "$pid"
}

pg_ready() { "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -d postgres -t 2 >/dev/null 2>&1; }

# After a kill -9 of the postmaster, its children notice and exit within moments; wait for that
# (a still-attached shared memory segment would make the new postmaster refuse to start), then
# remove the stale lock files.
pg_clear_stale() {
    local real i p left
    real="$(readlink -f "$pgdata")"
    for i in $(seq 1 50); do
        left=""
        for p in $(find /proc/[0-9]*/cwd -maxdepth 0 -lname "$real" 2>/dev/null); do
            p="${p%/cwd}"
            case "$(readlink "$p/exe" 2>/dev/null || true)" in */postgres*) ;; *) continue ;; esac
            left="$left ${p#/proc/}"
        done
        [ -z "$left" ] && break
        if [ "$i" -eq 50 ]; then
            log "killing leftover postgres processes of a dead postmaster:$left"
            kill -KILL $left 2>/dev/null || true
            sleep 1
        fi
        sleep 0.2
    done
    if [ -f "$pgdata/postmaster.pid" ]; then
        log "removing stale $pgdata/postmaster.pid"
        rm -f "$pgdata/postmaster.pid"
    fi
    rm -f "$pgrun"/.s.PGSQL.*
}

pg_init() {
    # postgres must be able to traverse every parent of $svc
    as_pg test -x "$svc" || die "user $pg_user cannot access $svc; set MQ_SERVICES_DIR to a directory it can reach (e.g. /var/tmp/mq-services)"
    install -d -m 755 -o "$pg_user" "$pgrun"   # clients (e.g. root) may use the socket dir
    if [ ! -f "$pgdata/PG_VERSION" ] || [ ! -f "$pgdata/global/pg_control" ]; then
        [ -e "$pgdata" ] && { log "removing incomplete data directory $pgdata"; rm -rf "$pgdata"; }
        local stage="$svc/pg.initdb"
        rm -rf "$stage"
        install -d -m 700 -o "$pg_user" "$stage"
        log "initdb $pgdata"
        as_pg "$PGBIN/initdb" -D "$stage" -U postgres -E UTF8 --locale=C \
            --auth-local=trust --auth-host=scram-sha-256 >"$svc/initdb.log" 2>&1 \
            || { cat "$svc/initdb.log" >&2; die "initdb failed"; }
        echo "include_if_exists = 'mq.conf'" >>"$stage/postgresql.conf"
        mv "$stage" "$pgdata"                # complete data dirs only
    fi
    # Regenerated on every start so port/socket changes take effect.
    cat >"$pgdata/mq.conf" <<EOF
# written by scripts/services.sh
listen_addresses = '$listen'
port = $pg_port
unix_socket_directories = '$pgrun'
fsync = ${MQ_PG_FSYNC:-on}
synchronous_commit = on
full_page_writes = on
max_connections = 200
EOF
    chown "$pg_user" "$pgdata/mq.conf"
    # Password logins on MQ_SERVICES_HOST, as on 127.0.0.1 (initdb's line): a block of its own,
    # written again on every start (PostgreSQL 15's pg_hba.conf has no include).
    sed -i '/^# mq-services-host begin/,/^# mq-services-host end/d' "$pgdata/pg_hba.conf"
    if [ -n "$services_host" ]; then
        printf '# mq-services-host begin (scripts/services.sh)\nhost all all %s scram-sha-256\n# mq-services-host end\n' \
            "$services_clients" >>"$pgdata/pg_hba.conf"
    fi
    touch "$pglog"; chown "$pg_user" "$pglog"
}

pg_bootstrap_db() {
    "$PGBIN/psql" -X -q -h "$pgrun" -p "$pg_port" -U postgres -d postgres -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mq') THEN
    CREATE ROLE mq LOGIN PASSWORD 'mq' CREATEDB;
  ELSE
    ALTER ROLE mq LOGIN PASSWORD 'mq' CREATEDB;
  END IF;
END
$$;
SELECT 'CREATE DATABASE mq OWNER mq' WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'mq')
\gexec
SQL
}

pg_start() {
    local logpos=1
    pg_setup_vars
    if [ -n "$(pg_pid)" ]; then
        log "postgres already running (pid $(pg_pid))"
    else
        [ -d "$pgdata" ] && pg_clear_stale
        pg_init
        log "starting postgres on $listen:$pg_port (data $pgdata)"
        local tries=1
        # The port lies in Linux's ephemeral range (32768-60999): a client's outgoing connection
        # may hold it as its local port for a moment, and the bind fails. Try again a few times.
        while :; do
            logpos=$(($(wc -l <"$pglog" 2>/dev/null || echo 0) + 1))   # show only this try's log on failure
            as_pg "$PGBIN/pg_ctl" -D "$pgdata" -l "$pglog" -w -t "$timeout" start >/dev/null 2>&1 8>&- && break
            if [ "$tries" -lt 5 ] && tail -n +"$logpos" "$pglog" | grep -q "Address already in use"; then
                log "postgres: port $pg_port is taken for now (a client's local port?); trying again"
                tries=$((tries + 1))
                sleep 2
                continue
            fi
            tail -n +"$logpos" "$pglog" | tail -n 20 >&2 || true
            die "postgres failed to start (log: $pglog)"
        done
    fi
    local i
    for i in $(seq 1 "$timeout"); do pg_ready && break; sleep 1; done
    pg_ready || { tail -n 20 "$pglog" >&2 || true; die "postgres not accepting connections on 127.0.0.1:$pg_port after ${timeout}s (a server started earlier with another MQ_PG_PORT? try: $0 restart; log: $pglog)"; }
    pg_bootstrap_db || die "could not create role/database mq"
}

pg_stop() {
    pg_setup_vars
    if [ -z "$(pg_pid)" ]; then
        log "postgres not running"
        [ -d "$pgdata" ] && pg_clear_stale
        return 0
    fi
    log "stopping postgres"
    as_pg "$PGBIN/pg_ctl" -D "$pgdata" -m fast -w -t 60 stop >/dev/null \
        || die "pg_ctl stop failed (log: $pglog)"
}

# ---------------------------------------------------------------- redis

# pid of the redis-server in directory $1 (its pidfile), only if alive and really redis-server.
redis_pid() {
    local pidfile="$1/redis.pid" pid
    [ -f "$pidfile" ] || return 0
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && [ -d "/proc/$pid" ] || return 0
    grep -q '^redis-server' "/proc/$pid/cmdline" 2>/dev/null || \
        case "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" in */redis-server*|*/redis-check-*) ;; *) return 0 ;; esac
    echo "$pid"
}

# redis-cli with a deadline (a non-Redis listener on the port would otherwise hang it forever)
rcli() { local port="$1"; shift; timeout "${RCLI_TIMEOUT:-10}" redis-cli -h 127.0.0.1 -p "$port" "$@"; }
redis_ping() { [ "$(RCLI_TIMEOUT=2 rcli "$1" ping 2>/dev/null)" = "PONG" ]; }

redis_log_tail() { tail -n +"$2" "$1/redis.log" 2>/dev/null | tail -n 20 >&2 || true; }

# $1 dir, $2 port, $3 extra config lines
redis_start_in() {
    local dir="$1" port="$2" extra="${3:-}" pid logpos=1
    [ -f "$dir/redis.log" ] && logpos=$(($(wc -l <"$dir/redis.log") + 1))   # show only this run's log
    pid="$(redis_pid "$dir")"
    if [ -n "$pid" ]; then
        log "redis :$port already running (pid $pid)"
    else
        if redis_ping "$port"; then
            die "port $port already serves a Redis that is not ours (no live pid in $dir/redis.pid)"
        fi
        mkdir -p "$dir"
        rm -f "$dir/redis.pid"          # stale pidfile from a killed run
        cat >"$dir/redis.conf" <<EOF
# written by scripts/services.sh
bind 127.0.0.1${services_host:+ $services_host}
port $port
protected-mode no
daemonize yes
supervised no
pidfile $dir/redis.pid
logfile $dir/redis.log
dir $dir
appendonly yes
appendfsync ${MQ_REDIS_FSYNC:-always}
aof-load-truncated yes
$extra
EOF
        log "starting redis on 127.0.0.1${services_host:+ and $services_host}:$port (dir $dir)"
        redis-server "$dir/redis.conf" 8>&- || { redis_log_tail "$dir" "$logpos"; die "redis-server :$port failed to start"; }
    fi
    local t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$timeout" ]; do
        redis_ping "$port" && return 0
        # the pidfile is written once the port is bound; no live pid after 3 s = it died
        if [ $((SECONDS - t0)) -ge 3 ] && [ -z "$(redis_pid "$dir")" ]; then
            redis_log_tail "$dir" "$logpos"
            die "redis-server :$port exited during startup (log: $dir/redis.log)"
        fi
        sleep 0.2
    done
    redis_log_tail "$dir" "$logpos"
    die "redis not answering PING on 127.0.0.1:$port after ${timeout}s (log: $dir/redis.log)"
}

redis_stop_in() {
    local dir="$1" port="$2" pid i
    pid="$(redis_pid "$dir")"
    if [ -z "$pid" ]; then
        log "redis :$port not running"
        rm -f "$dir/redis.pid"
        return 0
    fi
    log "stopping redis :$port (pid $pid)"
    # SHUTDOWN flushes/fsyncs the AOF; fall back to NOSAVE if the RDB save fails.
    rcli "$port" shutdown >/dev/null 2>&1 || rcli "$port" shutdown nosave >/dev/null 2>&1 || true
    for i in $(seq 1 150); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
    if [ -d "/proc/$pid" ]; then
        log "redis :$port did not exit after SHUTDOWN; sending SIGTERM"
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 1 50); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
        [ -d "/proc/$pid" ] && die "redis :$port (pid $pid) would not stop"
    fi
    rm -f "$dir/redis.pid"
}

replica_dir() { echo "$svc/redis-replica-$1"; }

redis_replica() {
    local action="${1:-}" port="${2:-}"
    [[ "$port" =~ ^[0-9]+$ ]] || die "usage: $0 redis-replica start|stop|status PORT"
    [ "$port" != "$redis_port" ] || die "replica port must differ from the primary's ($redis_port)"
    local dir; dir="$(replica_dir "$port")"
    case "$action" in
        start)
            redis_ping "$redis_port" || die "primary redis :$redis_port is not running (run: $0 start)"
            redis_start_in "$dir" "$port" "replicaof 127.0.0.1 $redis_port
replica-read-only yes"
            local i
            for i in $(seq 1 "$((timeout * 5))"); do
                rcli "$port" info replication 2>/dev/null | grep -q '^master_link_status:up' && return 0
                sleep 0.2
            done
            die "replica :$port did not sync with primary :$redis_port within ${timeout}s"
            ;;
        stop) redis_stop_in "$dir" "$port" ;;
        status)
            if [ -n "$(redis_pid "$dir")" ] && redis_ping "$port"; then
                echo "redis-replica: running on 127.0.0.1:$port ($(rcli "$port" info replication | grep -o 'master_link_status:[a-z]*'))"
            else
                echo "redis-replica: not running (:$port)"; return 3
            fi ;;
        *) die "usage: $0 redis-replica start|stop|status PORT" ;;
    esac
}

stop_all_replicas() {
    local d
    for d in "$svc"/redis-replica-*; do
        [ -d "$d" ] && [ -n "$(redis_pid "$d")" ] || continue
        redis_stop_in "$d" "${d##*/redis-replica-}"
    done
}

# ---------------------------------------------------------------- redis cluster

# Three primaries and no replicas (`KV_URL=redis-cluster://...`): ports cluster_port+0..2, their
# cluster bus on cluster_port+3..5 (the default bus port, port + 10000, is past 65535 here).
cluster_ports() { echo "$cluster_port" "$((cluster_port + 1))" "$((cluster_port + 2))"; }
cluster_dir() { echo "$svc/redis-cluster-$1"; }

# $1: a primary's port; prints one word: ok (this node sees the whole cluster serving every
# slot), new (a node that was never joined to one), or other (forming, or half made).
cluster_node_state() {
    local info
    info="$(RCLI_TIMEOUT=2 rcli "$1" cluster info 2>/dev/null | tr -d '\r')" || { echo other; return 0; }
    if grep -q '^cluster_state:ok' <<<"$info" && grep -q '^cluster_known_nodes:3$' <<<"$info" \
        && grep -q '^cluster_slots_assigned:16384$' <<<"$info"; then
        echo ok
    elif grep -q '^cluster_known_nodes:1$' <<<"$info" && grep -q '^cluster_slots_assigned:0$' <<<"$info"; then
        echo new
    else
        echo other
    fi
}

# ok | new | other, for the three primaries together
cluster_state() {
    local p s all=""
    for p in $(cluster_ports); do s="$(cluster_node_state "$p")"; all="$all $s"; done
    case "$all" in " ok ok ok") echo ok ;; " new new new") echo new ;; *) echo other ;; esac
}

cluster_wait_ok() {  # $1: seconds
    local t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$1" ]; do
        [ "$(cluster_state)" = ok ] && return 0
        sleep 0.2
    done
    return 1
}

cluster_node_start() {  # $1: the primary's port
    redis_start_in "$(cluster_dir "$1")" "$1" "cluster-enabled yes
cluster-config-file nodes.conf
cluster-port $(($1 + 3))
cluster-node-timeout 5000${services_host:+
cluster-announce-ip $services_host}"
}

# SIGKILL one primary of the cluster and start it again: its slots come back with its AOF.
redis_cluster_restart_node() {
    local port="${1:-}" pid i
    [[ " $(cluster_ports) " == *" $port "* ]] || die "usage: $0 redis-cluster-restart PORT (one of $(cluster_ports))"
    pid="$(redis_pid "$(cluster_dir "$port")")"
    [ -n "$pid" ] || die "redis cluster node :$port is not running"
    log "killing redis cluster node :$port (pid $pid) and starting it again from its AOF"
    kill -KILL "$pid"
    for i in $(seq 1 100); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    [ -d "/proc/$pid" ] && die "redis cluster node :$port (pid $pid) survived SIGKILL"
    cluster_node_start "$port"
    cluster_wait_ok "$timeout" || die "redis cluster not ok ${timeout}s after :$port came back"
}

redis_cluster_start() {
    local p addrs=()
    for p in $(cluster_ports); do
        cluster_node_start "$p"
        addrs+=("${services_host:-127.0.0.1}:$p")
    done
    local state; state="$(cluster_state)"
    # A restart finds its nodes.conf and the cluster forms again by itself within moments.
    if [ "$state" = other ] && ! cluster_wait_ok "$timeout"; then
        # (a create that was interrupted: these are test data, start over from empty nodes)
        log "redis cluster on ${addrs[*]} did not form; resetting its nodes and creating it again"
        for p in $(cluster_ports); do
            rcli "$p" flushall >/dev/null 2>&1 || true
            rcli "$p" cluster reset hard >/dev/null || die "CLUSTER RESET on :$p failed"
        done
        state=new
    fi
    if [ "$state" = new ]; then
        log "creating redis cluster on ${addrs[*]} (3 primaries, no replicas)"
        RCLI_TIMEOUT=120 rcli "$cluster_port" --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
            >"$svc/redis-cluster-create.log" 2>&1 \
            || { tail -n 20 "$svc/redis-cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
        cluster_wait_ok "$timeout" || die "redis cluster on ${addrs[*]} not ok ${timeout}s after its creation"
    fi
}

redis_cluster_stop() {
    local p rc=0
    for p in $(cluster_ports); do redis_stop_in "$(cluster_dir "$p")" "$p" || rc=1; done
    return $rc
}

redis_cluster_status() {
    local p running=0
    for p in $(cluster_ports); do
        [ -n "$(redis_pid "$(cluster_dir "$p")")" ] && running=$((running + 1))
    done
    if [ "$running" -eq 3 ] && [ "$(cluster_state)" = ok ]; then
        echo "redis-cluster: running on 127.0.0.1:$cluster_port-$((cluster_port + 2)) (3 primaries, state ok)"
    else
        echo "redis-cluster: not running ($running of 3 primaries up, ports $cluster_port-$((cluster_port + 2)))"
        return 3
    fi
}

redis_cluster() {
    case "${1:-}" in
        start) ensure_packages; with_lock; redis_cluster_start ;;
        stop) [ -d "$svc" ] || return 0; with_lock; redis_cluster_stop ;;
        status) redis_cluster_status ;;
        *) die "usage: $0 redis-cluster start|stop|status" ;;
    esac
}

# ---------------------------------------------------------------- outages (tests/integration/test_store_outages.py)

# An abrupt restart: the process dies without SHUTDOWN, so what comes back is what the
# append-only file held: every acknowledged write (see MQ_REDIS_FSYNC above).
redis_restart() {
    local pid i
    pid="$(redis_pid "$rdir")"
    [ -n "$pid" ] || die "redis :$redis_port is not running"
    log "killing redis :$redis_port (pid $pid) and starting it again from its AOF"
    kill -KILL "$pid"
    for i in $(seq 1 100); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    [ -d "/proc/$pid" ] && die "redis :$redis_port (pid $pid) survived SIGKILL"
    redis_start_in "$rdir" "$redis_port"
}

pg_restart() {
    pg_setup_vars
    [ -n "$(pg_pid)" ] || die "postgres is not running"
    log "restarting postgres (-m fast)"
    as_pg "$PGBIN/pg_ctl" -D "$pgdata" -m fast -w -t 60 restart -l "$pglog" >/dev/null 2>&1 8>&- \
        || { tail -n 20 "$pglog" >&2 || true; die "pg_ctl restart failed (log: $pglog)"; }
    local i
    for i in $(seq 1 "$timeout"); do pg_ready && return 0; sleep 0.2; done
    die "postgres not accepting connections after restart"
}

# Every process of the server: the postmaster and its backends (their cwd is the data
# directory), or the redis-server.
server_pids() {
    case "$1" in
        redis) redis_pid "$rdir" ;;
        pg)
            local real p
            real="$(readlink -f "$pgdata")"
            for p in $(find /proc/[0-9]*/cwd -maxdepth 0 -lname "$real" 2>/dev/null); do
                p="${p%/cwd}"
                case "$(readlink "$p/exe" 2>/dev/null || true)" in */postgres*) echo "${p#/proc/}" ;; esac
            done ;;
        *) die "usage: $0 pause redis|pg SECONDS" ;;
    esac
}

pause_server() {
    local what="$1" secs="$2"
    [[ "$secs" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "usage: $0 pause redis|pg SECONDS"
    [ "$what" = pg ] && pg_setup_vars
    paused_pids="$(server_pids "$what" | tr '\n' ' ')"
    [ -n "${paused_pids// /}" ] || die "$what is not running"
    # Whatever happens to this script, the server must not stay stopped.
    trap 'kill -CONT $paused_pids 2>/dev/null || true' EXIT
    trap 'exit 143' INT TERM
    log "pausing $what (pids $paused_pids) for ${secs}s"
    kill -STOP $paused_pids
    sleep "$secs"
    kill -CONT $paused_pids
    log "$what resumed"
}

# ---------------------------------------------------------------- commands

with_lock() {  # serialize start/stop across concurrent invocations
    mkdir -p "$svc"
    chmod 755 "$svc"
    # fd 8 holds the lock; it is closed (8>&-) for the daemons we spawn so they do not keep it.
    exec 8>"$svc/.lock"
    flock -w 120 8 || die "timed out waiting for $svc/.lock"
}

cmd_start() {
    ensure_packages
    with_lock
    pg_start
    redis_start_in "$rdir" "$redis_port"
    redis_cluster_start
    log "ready: postgres 127.0.0.1:$pg_port, redis 127.0.0.1:$redis_port, redis cluster 127.0.0.1:$cluster_port-$((cluster_port + 2))"
}

cmd_stop() {
    [ -d "$svc" ] || { log "nothing to stop ($svc does not exist)"; return 0; }
    with_lock
    local rc=0
    stop_all_replicas || rc=1
    redis_stop_in "$rdir" "$redis_port" || rc=1
    redis_cluster_stop || rc=1
    if command -v pg_ctl >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
        (pg_stop) || rc=1
    fi
    return $rc
}

cmd_status() {
    local rc=0
    pg_setup_vars
    local pid; pid="$(pg_pid)"
    if [ -n "$pid" ] && pg_ready; then
        echo "postgres: running on 127.0.0.1:$pg_port (pid $pid, data $pgdata)"
    elif [ -n "$pid" ]; then
        echo "postgres: process $pid alive but not accepting connections on :$pg_port"; rc=3
    else
        echo "postgres: not running"; rc=3
    fi
    pid="$(redis_pid "$rdir")"
    if [ -n "$pid" ] && redis_ping "$redis_port"; then
        echo "redis:    running on 127.0.0.1:$redis_port (pid $pid, dir $rdir)"
    else
        echo "redis:    not running"; rc=3
    fi
    local d
    for d in "$svc"/redis-replica-*; do
        [ -d "$d" ] && [ -n "$(redis_pid "$d")" ] && redis_replica status "${d##*/redis-replica-}" || true
    done
    redis_cluster_status || rc=3
    return $rc
}

cmd_env() {
    cat <<EOF
export DATABASE_URL=postgres://mq:mq@127.0.0.1:$pg_port/mq
export REDIS_URL=redis://127.0.0.1:$redis_port/0
export KV_URL=redis://127.0.0.1:$redis_port/1
export CELERY_BROKER_URL=redis://127.0.0.1:$redis_port/2
export MQ_TEST_PG_URL=postgres://mq:mq@127.0.0.1:$pg_port/mq
export MQ_TEST_REDIS_URL=redis://127.0.0.1:$redis_port
export MQ_TEST_REDIS_CLUSTER_URL=redis-cluster://127.0.0.1:$cluster_port,127.0.0.1:$((cluster_port + 1)),127.0.0.1:$((cluster_port + 2))
EOF
}

# PostgreSQL's default ports (54329, 54330) lie in Linux's ephemeral range (32768-60999): a client
# connection made just before a server starts may be given one as its local port, and the server's
# bind then fails (pg_start tries again for 10 s; a long-lived connection outlasts that). The test
# suite reserves its ports before any shard starts; where this user may not write the setting
# (not root, a container), nothing changes.
reserve_ports() {
    local file=/proc/sys/net/ipv4/ip_local_reserved_ports port current
    [ -w "$file" ] || return 0
    current="$(cat "$file")"
    for port in "$@"; do
        case "$port" in ''|*[!0-9]*) die "reserve-ports: not a port: $port" ;; esac
        case ",$current," in *",$port,"*) continue ;; esac
        current="${current:+$current,}$port"
    done
    echo "$current" >"$file" 2>/dev/null || log "could not reserve ports $* (ip_local_reserved_ports)"
}

case "${1:-}" in
    start)   cmd_start ;;
    reserve-ports) shift; reserve_ports "$@" ;;
    packages) ensure_packages ;;
    stop)    cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status)  cmd_status ;;
    env)     cmd_env ;;
    redis-replica) shift; redis_replica "$@" ;;
    redis-cluster) shift; redis_cluster "$@" ;;
    redis-restart) with_lock; redis_restart ;;
    redis-cluster-restart) with_lock; redis_cluster_restart_node "${2:-}" ;;
    pg-restart) with_lock; pg_restart ;;
    pause) pause_server "${2:-}" "${3:-}" ;;
    *) echo "usage: $0 start|stop|restart|status|env | redis-replica start|stop|status PORT | redis-cluster start|stop|status | redis-restart | redis-cluster-restart PORT | pg-restart | pause redis|pg SECONDS" >&2; exit 2 ;;
esac
