"""runnode refuses a port something already listens on: granian binds with SO_REUSEPORT, so a
second node on a running node's port would otherwise start, and the kernel would split the
clients' connections between the two without a word."""

from __future__ import annotations

import socket

import pytest

from tests.integration.nodes import local_node_env
from tests.launcher import NodeFailed, NodeProcess

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]


def _listener(reuseport: bool) -> socket.socket:
    s = socket.socket()
    if reuseport:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as granian binds
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


@pytest.mark.parametrize("reuseport", [True, False], ids=["a node's socket", "another program's"])
def test_a_node_refuses_a_port_in_use(tmp_path, reuseport):
    with _listener(reuseport) as taken:
        node = NodeProcess(local_node_env(tmp_path), tmp_path, port=taken.getsockname()[1])
        try:
            with pytest.raises(NodeFailed, match="is in use: another node"):
                node.start(timeout=60)
        finally:
            node.stop()  # (one that started after all must not outlive the test)


def test_a_running_node_keeps_its_port_and_a_second_one_is_refused(tmp_path):
    import contextlib

    first = NodeProcess(local_node_env(tmp_path, data="a"), tmp_path).start()
    try:
        (tmp_path / "b").mkdir()
        second = NodeProcess(local_node_env(tmp_path, data="b"), tmp_path / "b", port=first.port)
        with contextlib.suppress(NodeFailed):
            second.start(timeout=60)  # (the first node answers the health check on that port)
        try:
            assert second.proc is not None and second.proc.wait(timeout=60) != 0
            assert "is in use: another node" in second.log_tail()
        finally:
            second.stop()
        assert first.healthy()
    finally:
        first.stop()
