"""A node of two processes shares its few long-lived client connections evenly between them
(``queues.cluster.balance``): the kernel's spread of four connections is 3:1 or 4:0 more often than
2:2, and a connection stays with the process that accepted it."""

from __future__ import annotations

import http.client
import os
import threading
import time
from pathlib import Path

import pytest

from tests.launcher import NodeProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.node(env={"NODE_BALANCE_INTERVAL": "0.2"})]


def _server_inodes(port: int) -> dict[int, int]:
    """``{client's local port: inode of the node's end}`` of the established connections to
    ``port`` (``/proc/net/tcp``: addresses in hex, state 01 = established)."""
    out = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local_port, remote_port = int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16)
        if local_port == port and f[3] == "01":
            out[remote_port] = int(f[9])
    return out


def _owner_of_inodes(pids: list[int]) -> dict[int, int]:
    owners = {}
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                owners[int(link[8:-1])] = pid
    return owners


class Clients:
    """``n`` keep-alive clients, each a thread calling the node over its own connection until
    stopped (http.client opens a new connection after a ``Connection: close``)."""

    def __init__(self, node: NodeProcess, n: int):
        self.node, self.stop, self.statuses = node, threading.Event(), []
        self.conns = [http.client.HTTPConnection("127.0.0.1", node.port, timeout=10) for _ in range(n)]
        self.threads = [threading.Thread(target=self._run, args=(c,)) for c in self.conns]
        for t in self.threads:
            t.start()

    def _run(self, conn: http.client.HTTPConnection) -> None:
        while not self.stop.is_set():
            conn.request("GET", "/api/v1/healthz")
            r = conn.getresponse()
            r.read()
            self.statuses.append(r.status)

    def split(self) -> list[int]:
        """How many of the clients' connections each process holds, most first."""
        inodes = _server_inodes(self.node.port)
        owners = _owner_of_inodes(self.node.member_pids())
        per: dict[int, int] = dict.fromkeys(self.node.member_pids(), 0)
        for conn in self.conns:
            sock = conn.sock
            if sock is None:
                continue
            try:
                inode = inodes.get(sock.getsockname()[1])
            except OSError:  # closed just now
                continue
            if inode in owners:
                per[owners[inode]] += 1
        return sorted(per.values(), reverse=True)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)
        for c in self.conns:
            c.close()


def _shed_total(node: NodeProcess) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    lines = [line for line in text.splitlines() if line.startswith("mq_node_connections_shed_total")]
    assert lines, "mq_node_connections_shed_total is missing from /metrics"
    return sum(float(line.split()[-1]) for line in lines)


def _connections_figure(node: NodeProcess) -> list[float]:
    """``mq_node_client_connections`` of each process, most first (one scrape: the node's)."""
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    lines = [line for line in text.splitlines() if line.startswith("mq_node_client_connections{")]
    return sorted((float(line.split()[-1]) for line in lines), reverse=True)


def _until_even(clients: Clients, timeout: float = 40) -> list[list[int]]:
    """The splits seen, every 0.25 s, until 2:2 was seen four times running."""
    seen: list[list[int]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append(clients.split())
        if seen[-4:] == [[2, 2]] * 4:
            return seen
        time.sleep(0.25)
    raise AssertionError(f"the four connections never settled 2:2; splits seen: {seen}")


def test_four_clients_end_up_two_on_each_process_and_stay_there(node_factory):
    node = node_factory(processes=2)
    # Twice over, new connections each time: the kernel's first spread is uneven more often
    # than not (5 in 8), so a node that did not even it out would fail here 6 times in 7.
    for _ in range(2):
        before = _shed_total(node)
        clients = Clients(node, 4)
        try:
            seen = _until_even(clients)
            # even, and left alone: no more connections are closed
            shed = _shed_total(node)
            first = next(split for split in seen if sum(split) == 4)  # every client connected
            if first != [2, 2]:
                assert shed > before  # evened out by the node, not by luck
            time.sleep(2.0)  # ten looks
            assert clients.split() == [2, 2]
            assert _shed_total(node) == shed
            # the operator sees the spread: each process's busy connections, by its address
            # (the scrape's own connection may be counted by the process that answers it)
            assert _connections_figure(node) in ([2.0, 2.0], [3.0, 2.0])
        finally:
            clients.close()
        # every call of a client whose connection was closed between two calls succeeded
        assert clients.statuses and set(clients.statuses) == {200}
