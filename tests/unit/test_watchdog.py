"""The serving watchdog (``queues.cluster.watchdog``) against sockets, without a node."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from queues.cluster import watchdog


class OneConnection:
    """A server that takes one connection and answers each probe on it (while ``hold`` is not
    set); the connections after it wait in its listen queue, never accepted: a server at its
    backpressure, or every request thread of one busy."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.hold, self.closed = threading.Event(), threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        conn, _ = self.listener.accept()
        with conn:
            data = b""
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
                while b"\r\n\r\n" in data:
                    _, data = data.split(b"\r\n\r\n", 1)
                    if self.hold.is_set():
                        self.closed.wait(10)  # (the probe times out first)
                        return
                    conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    def close(self):
        self.closed.set()
        self.listener.close()


def test_a_server_that_accepts_no_new_connection_leaves_a_serving_process_serving():
    # a server that answers on the connection it took and accepts no other (its connections
    # at their limit: idle clients kept alive), every request thread free
    server = OneConnection()
    try:
        dog = watchdog.Watchdog(server.address, interval=0.1, stuck_after=0.5)
        # when it probes again and again
        answers = [dog.probe() for _ in range(3)]
        # then every probe is answered, on the one connection: the process serves
        assert answers == [True, True, True] and dog.serving()
    finally:
        server.close()


def test_a_probe_left_unanswered_says_stuck_and_an_answer_says_serving_again():
    # a server whose connection answered a probe, then no more (every request thread busy)
    server = OneConnection()
    try:
        dog = watchdog.Watchdog(server.address, interval=0.1, stuck_after=0.5)
        assert dog.probe() is True and dog.serving()
        server.hold.set()
        assert dog.probe() is False and not dog.serving()
        # and a new connection that is never accepted gives no verdict: still stuck
        assert dog.probe() is None and not dog.serving()
    finally:
        server.close()

    class Alive(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(204 if self.path == watchdog.PATH else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    alive = ThreadingHTTPServer(("127.0.0.1", 0), Alive)
    threading.Thread(target=alive.serve_forever, daemon=True).start()
    try:
        dog.host, dog.port = "127.0.0.1", alive.server_address[1]
        assert dog.probe() is True and dog.serving()
    finally:
        alive.shutdown()


def test_a_new_connection_left_unanswered_gives_no_verdict():
    # a listener whose connections are queued and never taken (a process starting, or one at
    # its connections' limit): nothing says whether a request thread would be free
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        dog = watchdog.Watchdog(f"127.0.0.1:{listener.getsockname()[1]}", interval=0.1, stuck_after=0.5)
        assert dog.probe() is None and dog.serving()


def test_a_refused_probe_gives_no_verdict():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        dog = watchdog.Watchdog(f"127.0.0.1:{port}", interval=0.1, stuck_after=0.5)
        assert dog.probe() is None and dog.serving()


def test_the_probe_path_is_answered_before_the_app():
    called = []

    def app(environ, start_response):
        called.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"app"]

    wrapped = watchdog.ServingProbe(app)
    statuses = []
    assert wrapped({"PATH_INFO": watchdog.PATH, "REQUEST_METHOD": "GET"}, lambda s, h: statuses.append(s)) == [b""]
    assert wrapped({"PATH_INFO": watchdog.PATH, "REQUEST_METHOD": "POST"}, lambda s, h: statuses.append(s)) == [b"app"]
    assert statuses == ["204 No Content", "200 OK"] and called == [watchdog.PATH]
