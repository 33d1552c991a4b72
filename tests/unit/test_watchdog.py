"""The serving watchdog (``queues.watchdog``) against sockets, without a node."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from queues import watchdog


def test_a_probe_left_unanswered_says_stuck_and_an_answer_says_serving_again():
    # a listener whose calls are queued and never taken (every request thread busy)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        dog = watchdog.Watchdog(f"127.0.0.1:{listener.getsockname()[1]}", interval=0.1, stuck_after=0.5)
        assert dog.probe() is None and dog.serving()  # within the start-up grace: no verdict
        dog._started -= watchdog.START_GRACE
        assert dog.probe() is False and not dog.serving()

    class Alive(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(204 if self.path == watchdog.PATH else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Alive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dog.host, dog.port = "127.0.0.1", server.server_address[1]
        assert dog.probe() is True and dog.serving()
    finally:
        server.shutdown()


def test_a_refused_probe_gives_no_verdict():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        dog = watchdog.Watchdog(f"127.0.0.1:{port}", interval=0.1, stuck_after=0.5)
        dog._started -= watchdog.START_GRACE
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
