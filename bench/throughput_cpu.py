"""CPU accounting for bench/throughput.py: what each side of a system burned, from the kernel's
counters (``/proc``) and Redis' own (``INFO cpu``), so that CPU per message stays meaningful on
a machine that other work shares.

Three kinds of server-side counters, each a cumulative number of CPU seconds that the parent
reads before and after a phase:

* a node: every process of the session ``runnode`` leads (``NodeProcess`` starts it in a
  session of its own), so a node's worker and any number of serving processes are summed;
* PostgreSQL backends: the backends whose ``application_name`` is the one the system's
  connections set (``pg_stat_activity``); a backend that ends keeps its last reading;
* Redis: ``used_cpu_user + used_cpu_sys`` of every server of a deployment (one server, or every
  node a Redis Cluster lists in ``CLUSTER NODES``).

Beside them, one count our node keeps itself: the calls its processes forwarded to another
node or to a sibling (``mq_forwarded_calls_total`` of its ``/metrics``, every process summed).

The parsers are pure functions (tests/unit/test_bench_cpu.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------
# pure parsers
# --------------------------------------------------------------------------------------


def parse_proc_stat(text: str) -> tuple[int, int]:
    """``(session id, CPU ticks)`` from the text of ``/proc/<pid>/stat``.

    Ticks = utime + stime + cutime + cstime: the process' own time and that of the children
    it reaped. The command name (field 2) is in parentheses and may hold spaces or ``)``, so
    the fields are counted from the LAST ``)``. ValueError if the text is not such a line."""
    end = text.rindex(")")
    fields = text[end + 2 :].split()
    # fields[0] is field 3 (state): session is field 6, utime..cstime are fields 14..17
    if len(fields) < 15:
        raise ValueError(f"short /proc stat line: {text[:80]!r}")
    return int(fields[3]), sum(int(x) for x in fields[11:15])


def parse_cluster_nodes(reply) -> list[tuple[str, int]]:
    """``(host, port)`` of every node a ``CLUSTER NODES`` reply lists, failed ones left out.

    A line is ``<id> <ip:port@cport[,hostname]> <flags> ...``; the address may be ``:0`` for
    a node that has no address yet (left out too). redis-py hands the reply over parsed, as
    ``{"ip:port@cport": {"node_id": ..., "flags": ...}, ...}``: taken as such lines."""
    if isinstance(reply, dict):
        reply = "\n".join(f"{v.get('node_id', '?')} {addr} {v.get('flags', '')}" for addr, v in reply.items())
    text = reply.decode() if isinstance(reply, bytes) else reply
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or "fail" in parts[2].split(",") or "noaddr" in parts[2].split(","):
            continue
        addr = parts[1].split("@", 1)[0]
        host, _, port = addr.rpartition(":")
        if host and port.isdigit() and int(port) > 0:
            out.append((host.strip("[]"), int(port)))
    return out


def parse_cluster_url(url: str) -> list[tuple[str, int]]:
    """The seed nodes of ``redis-cluster://h1:p1,h2:p2,...`` (a path or query is ignored)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "redis-cluster":
        raise ValueError(f"not a redis-cluster:// URL: {url!r}")
    rest = rest.split("/", 1)[0].split("?", 1)[0]
    rest = rest.rsplit("@", 1)[-1]  # credentials, if any
    seeds = []
    for item in rest.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"seed {item!r} of {url!r} is not host:port")
        seeds.append((host, int(port)))
    return seeds


def parse_forwarded_calls(text: str) -> float:
    """The sum of ``mq_forwarded_calls_total`` over its labels, from a ``/metrics`` text
    (Prometheus' text format); 0 when the node has forwarded nothing yet."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "mq_forwarded_calls_total"
    )


def per_message_us(cpu_s: float | None, count: int | float | None) -> float | None:
    """CPU microseconds per message (or per call); None when either side is unknown or zero."""
    if cpu_s is None or cpu_s != cpu_s or not count:
        return None
    return cpu_s / count * 1e6


# --------------------------------------------------------------------------------------
# /proc readers
# --------------------------------------------------------------------------------------


def read_proc_stat(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return parse_proc_stat(f.read())
    except (OSError, ValueError):
        return None


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime (+ reaped children) of one process; NaN if it is gone."""
    st = read_proc_stat(pid)
    return float("nan") if st is None else st[1] / CLK_TCK


def session_cpu_seconds(sid: int) -> float:
    """CPU seconds of every live process of session ``sid`` (with the children each reaped);
    NaN if no process of the session is left. The leader itself may be out of sight (session 0,
    or a leader in another PID namespace, as under a CI runner), so it is not what decides."""
    pids = session_pids(sid)
    if not pids:
        return float("nan")
    total = 0
    for pid in pids:
        st = read_proc_stat(pid)
        if st is not None and st[0] == sid:
            total += st[1]
    return total / CLK_TCK


def session_pids(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = read_proc_stat(int(entry))
            if st is not None and st[0] == sid:
                out.append(int(entry))
    return sorted(out)


def box_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return (sum(parts[:8]) - idle) / CLK_TCK


def background_load(seconds: float) -> float:
    """Cores busy on the machine over `seconds` while the bench itself does nothing."""
    b0 = box_busy_seconds()
    time.sleep(seconds)
    return (box_busy_seconds() - b0) / seconds


# --------------------------------------------------------------------------------------
# server-side meters (cumulative CPU seconds)
# --------------------------------------------------------------------------------------


class PgBackendMeter:
    """CPU seconds of the PostgreSQL backends whose application_name is ``app``, cumulative.

    Each reading lists the backends (pg_stat_activity, on a monitoring connection of its own
    that does not count) and reads their /proc counters; a backend seen before that has ended
    keeps its last reading, so the total never goes back. None if PostgreSQL does not run on
    this machine (a listed backend has no /proc entry) or cannot be asked."""

    def __init__(self, pg_url: str, app: str) -> None:
        self.pg_url, self.app = pg_url, app
        self.seen: dict[int, float] = {}
        self._conn = None

    def _pids(self) -> list[int]:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.pg_url, autocommit=True, application_name="mqbench-monitor")
        rows = self._conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (self.app,))
        return [r[0] for r in rows]

    def read(self) -> float | None:
        try:
            pids = self._pids()
        except Exception:
            self.close()
            return None
        for pid in pids:
            v = proc_cpu_seconds(pid)
            if v != v:
                if pid in self.seen:  # ended between the listing and the read: keep its last
                    continue
                return None  # not on this machine
            self.seen[pid] = v
        return sum(self.seen.values())

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None


def redis_cpu_seconds(clients: Iterable) -> float | None:
    """used_cpu_user + used_cpu_sys summed over redis-py clients, one per server."""
    total = 0.0
    try:
        for r in clients:
            info = r.info("cpu")
            total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    except Exception:
        return None
    return total


def summed(*meters: Callable[[], float | None]) -> float | None:
    """The sum of several cumulative readings; None if any is unknown."""
    vals = [m() for m in meters]
    if any(v is None or v != v for v in vals):
        return None
    return sum(v for v in vals if v is not None)
