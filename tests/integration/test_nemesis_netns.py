"""The nemesis run's network partitions (nemesis/netns.py) on this machine's kernel: namespaces
on a bridge, cuts from the stores and from the peers, heals, and nothing left behind.

Needs root and iproute2; skipped, with the reason, where ``Network.available()`` says no."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemesis.netns import Network, remove_leftovers
from tests.launcher import ROOT, free_port, free_ports

SERVICES = str(ROOT / "scripts" / "services.sh")
AVAILABLE, WHY = Network.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"needs root and network namespaces: {WHY}")

#: A client inside a namespace: one TCP round trip, its outcome printed as one word.
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        c.sendall(b"ping")
        print("ok" if c.recv(4) == b"ping" else "bad")
except TimeoutError:
    print("timeout")
except OSError as e:
    print(f"error:{e.errno}")
"""

#: An echo server inside a namespace (for node to node): prints "ready" once it listens.
SERVER = """
import socket, sys, threading
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
def echo(c):
    with c:
        while data := c.recv(64):
            c.sendall(data)
while True:
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
"""


@contextlib.contextmanager
def echo_server(host: str) -> Iterator[int]:
    """An echo server on ``host`` in this (the root) namespace; yields its port."""
    server = socket.create_server((host, 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.sendall(conn.recv(64))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


@contextlib.contextmanager
def echo_server_in(net: Network, node: str) -> Iterator[int]:
    """An echo server on node ``node``'s address, inside its namespace; yields its port."""
    proc = subprocess.Popen(
        net.wrap(node, [sys.executable, "-c", SERVER, net.node_host(node)]), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(5)


def round_trip(net: Network, node: str, host: str, port: int, timeout: float = 1.0) -> str:
    """One TCP round trip from inside node ``node``'s namespace: ok, timeout or error:<errno>."""
    done = subprocess.run(
        net.wrap(node, [sys.executable, "-c", CLIENT, host, str(port), str(timeout)]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def round_trip_here(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=2) as c:
        c.sendall(b"ping")
        return "ok" if c.recv(4) == b"ping" else "bad"


def names_of(run_id: str) -> tuple[list[str], list[str]]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    mine = f"mqn{run_id}-"
    return (
        [line.split()[0] for line in namespaces.splitlines() if line.startswith(mine)],
        [n for line in links.splitlines() if (n := line.split(": ")[1].split("@")[0]).startswith(mine)],
    )


def test_a_cut_from_the_stores_hangs_the_node_until_healed_and_the_others_go_on():
    with Network("tst1", ["a", "b"]) as net, echo_server(net.store_host) as port:
        # given: both nodes and this namespace reach the stores' address
        assert round_trip(net, "a", net.store_host, port) == "ok"
        assert round_trip(net, "b", net.store_host, port) == "ok"
        assert round_trip_here(net.store_host, port) == "ok"
        # when
        net.cut_from_stores("a")
        # then: a's connection attempt is lost, as in a real partition (no refusal)
        assert round_trip(net, "a", net.store_host, port) == "timeout"
        assert round_trip(net, "b", net.store_host, port) == "ok"
        with echo_server_in(net, "a") as node_port:
            # the run's clients still reach the cut node
            assert round_trip_here(net.node_host("a"), node_port) == "ok"
        # when
        net.heal("a")
        # then
        assert round_trip(net, "a", net.store_host, port) == "ok"


def test_a_reject_cut_refuses_at_once():
    with Network("tst2", ["a"], cut="reject") as net, echo_server(net.store_host) as port:
        net.cut_from_stores("a")
        started = time.monotonic()
        assert round_trip(net, "a", net.store_host, port, timeout=5) == "error:113"  # EHOSTUNREACH
        assert time.monotonic() - started < 4
        net.heal("a")
        assert round_trip(net, "a", net.store_host, port) == "ok"


def test_a_cut_from_the_peers_cuts_both_ways_and_leaves_the_stores():
    with (
        Network("tst3", ["a", "b", "c"]) as net,
        echo_server(net.store_host) as port,
        echo_server_in(net, "a") as a_port,
        echo_server_in(net, "b") as b_port,
    ):
        assert round_trip(net, "b", net.node_host("a"), a_port) == "ok"
        assert round_trip(net, "a", net.node_host("b"), b_port) == "ok"
        # when
        net.cut_from_peers("a")
        # then: a and its peers cannot reach each other, in either direction
        assert round_trip(net, "b", net.node_host("a"), a_port) == "timeout"
        assert round_trip(net, "a", net.node_host("b"), b_port) == "timeout"
        assert round_trip(net, "c", net.node_host("a"), a_port) == "timeout"
        # the others still reach each other, everyone reaches the stores, the clients reach a
        assert round_trip(net, "c", net.node_host("b"), b_port) == "ok"
        assert round_trip(net, "a", net.store_host, port) == "ok"
        assert round_trip_here(net.node_host("a"), a_port) == "ok"
        # when
        net.heal("a")
        # then
        assert round_trip(net, "b", net.node_host("a"), a_port) == "ok"
        assert round_trip(net, "a", net.node_host("b"), b_port) == "ok"


def test_close_removes_every_namespace_link_and_address():
    net = Network("tst4", ["a", "b"])
    with net:
        namespaces, links = names_of("tst4")
        assert sorted(namespaces) == ["mqntst4-0", "mqntst4-1"]
        assert sorted(links) == ["mqntst4-0h", "mqntst4-1h", "mqntst4-br"]
        store_host = net.store_host
        net.cut_from_stores("a")
    assert names_of("tst4") == ([], [])
    addresses = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    assert f" {store_host}/" not in addresses


def test_a_failure_halfway_through_making_it_removes_what_was_made():
    net = Network("tst5", ["a", "b"])
    # given: b's namespace exists already, so making it fails after a's is made
    subprocess.run(["ip", "netns", "add", "mqntst5-1"], check=True)
    with pytest.raises(Exception, match="mqntst5-1"), net:
        pass
    assert names_of("tst5") == ([], [])


#: A run killed before it removes its network.
LEAKY = """
import time
from nemesis.netns import Network
Network("tst6", ["a", "b"]).__enter__()
print("made", flush=True)
time.sleep(60)
"""


def test_remove_leftovers_removes_a_killed_runs_network_and_not_a_live_one():
    leaky = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LEAKY,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert leaky.stdout is not None
    assert leaky.stdout.readline().strip() == "made"
    with Network("tst7", ["a"]):
        # the leaky run is alive: nothing of it is removed
        assert not [name for name in remove_leftovers() if name.startswith("mqntst6")]
        leaky.send_signal(signal.SIGKILL)
        leaky.wait(5)
        removed = remove_leftovers()
        # the killed run's namespaces and bridge are gone, the live one's are there
        assert {"mqntst6-0", "mqntst6-1", "mqntst6-br"} <= set(removed)
        assert names_of("tst6") == ([], [])
        assert names_of("tst7")[0] == ["mqntst7-0"]
        assert not [name for name in removed if name.startswith("mqntst7")]
    assert names_of("tst7") == ([], [])


#: Inside a node's namespace: PostgreSQL, Redis and the Redis Cluster on the stores' address.
STORES_CLIENT = """
import sys
import psycopg, redis
from redis.cluster import RedisCluster

host, pg, rd, cluster = sys.argv[1], *map(int, sys.argv[2:])
try:
    with psycopg.connect(f"postgresql://mq:mq@{host}:{pg}/mq", connect_timeout=2) as c:
        print("pg", c.execute("select inet_server_addr()").fetchone()[0])
except psycopg.OperationalError as e:
    print("pg-failed", type(e).__name__)
    sys.exit()
print("redis", redis.Redis(host=host, port=rd, socket_timeout=2).ping())
nodes = RedisCluster(host=host, port=cluster, socket_timeout=2)
nodes.set("k", "v")
print("cluster", sorted({n.host for n in nodes.get_nodes()}), nodes.get("k").decode())
"""


@pytest.mark.slow
def test_the_stores_listen_on_the_store_address_for_the_namespaces():
    # services.sh with MQ_SERVICES_HOST, in a folder of its own that the postgres user can reach
    directory = Path(tempfile.mkdtemp(prefix="mqn-stores-", dir="/var/tmp"))
    directory.chmod(0o755)
    pg, rd, cluster = free_port(), free_port(), free_ports(6)
    with Network("tst8", ["a"]) as net:
        env = {
            **os.environ,
            "MQ_SERVICES_DIR": str(directory),
            "MQ_PG_PORT": str(pg),
            "MQ_REDIS_PORT": str(rd),
            "MQ_REDIS_CLUSTER_PORT": str(cluster),
            "MQ_SERVICES_HOST": net.store_host,
        }
        client = net.wrap("a", [sys.executable, "-c", STORES_CLIENT, net.store_host, str(pg), str(rd), str(cluster)])
        try:
            subprocess.run([SERVICES, "start"], env=env, check=True, capture_output=True, timeout=300)
            # when
            done = subprocess.run(client, capture_output=True, text=True, timeout=60)
            # then: every store answers on the stores' address, the cluster names it to clients
            assert done.stdout.split("\n")[:3] == [
                f"pg {net.store_host}",
                "redis True",
                f"cluster ['{net.store_host}'] v",
            ], done.stderr
            net.cut_from_stores("a")
            done = subprocess.run(client, capture_output=True, text=True, timeout=60)
            assert done.stdout.strip() == "pg-failed ConnectionTimeout", done.stderr
        finally:
            subprocess.run([SERVICES, "stop"], env=env, capture_output=True, timeout=300)
            shutil.rmtree(directory, ignore_errors=True)
