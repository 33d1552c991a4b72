"""Spreading a node's client connections over its processes (``queues.cluster.balance``): the rule, the
count of a process's busy connections (real sockets on loopback), and the WSGI side."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from queues.cluster import balance
from queues.cluster.balance import Balancer, busy_connections, should_shed


@pytest.mark.parametrize(
    "mine, siblings, shed",
    [
        (3, [1], True),
        (4, [0], True),
        (2, [0, 3], True),
        (2, [2], False),
        (2, [1], False),  # 2:1 cannot be evened out: moving one only swaps the sides
        (3, [2, 4], False),
        (1, [3], False),  # the sibling sheds, not this one
        (5, [], False),  # alone
        (0, [0], False),
    ],
)
def test_a_process_sheds_a_connection_only_when_that_evens_the_processes_out(mine, siblings, shed):
    assert should_shed(mine, siblings) is shed


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s
    s.close()


def _connect(listener: socket.socket, n: int) -> list[tuple[socket.socket, socket.socket]]:
    pairs = []
    for _ in range(n):
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        pairs.append((client, server))
    return pairs


def test_busy_connections_are_those_on_the_port_that_received_data_lately(listener):
    port = listener.getsockname()[1]
    pairs = _connect(listener, 4)
    elsewhere = socket.socket()  # a connection on another port: not the node's clients
    elsewhere.bind(("127.0.0.1", 0))
    elsewhere.listen(1)
    other = _connect(elsewhere, 1)
    try:
        time.sleep(1.0)  # all idle for a second
        # (the window below leaves 0.7 s for the checks: a loaded machine's /proc walk is slow)
        for client, server in pairs[:3] + other:
            client.sendall(b"x")
            assert server.recv(1) == b"x"
        # the listening socket and the client ends are not counted (another local port / LISTEN)
        assert busy_connections(port, active_ms=700) == 3
        assert busy_connections(port) == 4  # every one received data (or connected) within 30 s
        pairs[0][0].close()
        pairs[0][1].close()
        assert busy_connections(port, active_ms=700) == 2
    finally:
        for a, b in pairs + other:
            a.close()
            b.close()
        elsewhere.close()


def _app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def _call(app, port: str) -> list[tuple[str, str]]:
    got: list = []
    app({"SERVER_PORT": port}, lambda status, headers, exc_info=None: got.extend(headers))
    return got


def test_the_next_request_on_the_public_port_closes_its_connection_once(tmp_path):
    before = balance.metrics.CONNECTIONS_SHED._value.get()
    app = Balancer(_app, 8000, str(tmp_path), 1.0)
    assert ("Connection", "close") not in _call(app, "8000")
    app.shed = True
    assert ("Connection", "close") not in _call(app, "41234")  # a sibling's call on the private port
    assert ("Connection", "close") in _call(app, "8000")
    assert ("Connection", "close") not in _call(app, "8000")  # one connection per decision
    assert balance.metrics.CONNECTIONS_SHED._value.get() == before + 1


@pytest.fixture
def sibling_pid():
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


def test_a_step_publishes_the_count_and_sheds_when_a_sibling_has_two_fewer(
    tmp_path, listener, sibling_pid, monkeypatch
):
    monkeypatch.setattr(balance, "LAST_COUNT", None)  # this process has no balancer after the test
    port = listener.getsockname()[1]
    app = Balancer(_app, port, str(tmp_path), 1.0)
    sibling = tmp_path / f"{sibling_pid}{balance.SUFFIX}"
    pairs = _connect(listener, 3)
    try:
        sibling.write_text("1")
        app.step()
        assert (tmp_path / f"{os.getpid()}{balance.SUFFIX}").read_text() == "3"
        assert balance.LAST_COUNT == 3  # for mq_node_client_connections
        assert app.shed is False  # one look is not enough: a client may be arriving there
        app.step()
        assert app.shed is True  # 3:1 twice running
        app.step()
        assert app.shed is False  # after a shed, two fresh looks
        sibling.write_text("2")
        app.step()
        app.step()
        assert app.shed is False  # 3:2
        sibling.write_text("1")
        app.step()
        sibling.write_text("2")
        app.step()
        assert app.shed is False  # uneven at one look only
        sibling.write_text("0")
        os.utime(sibling, (time.time() - 10, time.time() - 10))  # a count 10 s old: stuck or gone
        app.step()
        app.step()
        assert app.shed is False
    finally:
        for a, b in pairs:
            a.close()
            b.close()
