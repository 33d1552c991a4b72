"""Whether a node process still answers calls: a probe of itself, through its own server.

A process holds leases for as long as its lease thread renews them, and that thread runs
whatever the request threads do. When every request thread is stuck (each waiting on a client
that trickles its body, say), the process serves nobody and yet keeps its partitions: no
other node may take them over. So each served process sends itself a small call every
``interval`` seconds, at the address it registered (``Node.address``: its own listener), and
:meth:`Watchdog.serving` says whether one came back within ``NODE_STUCK_AFTER`` seconds.
The call takes the way every call does (granian's queue, a request thread), and is answered
before Django (:class:`ServingProbe`): no database, no store, no lock of the node; only a free
request thread. While the answer is no, the runtime gives its leases up and claims none, and
stops its heartbeat (``NodeRuntime.renew``); when calls are answered again it joins as before.
"""

from __future__ import annotations

import http.client
import logging
import threading
from time import monotonic

log = logging.getLogger(__name__)

#: the probe's path, answered 204 by :class:`ServingProbe` (GET only; nothing else there).
PATH = "/-/alive"
#: seconds a process counts as serving after it starts, before its server takes calls.
START_GRACE = 15.0


class ServingProbe:
    """WSGI middleware, outermost: ``GET /-/alive`` answers 204 with nothing, from whatever
    request thread picks it up."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == PATH and environ.get("REQUEST_METHOD") == "GET":
            start_response("204 No Content", [("Cache-Control", "no-store")])
            return [b""]
        return self.app(environ, start_response)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    return ("127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host), int(port)


class Watchdog:
    """Probes ``address`` every ``interval`` seconds; :meth:`serving` is False once no probe
    has come back for ``stuck_after`` seconds."""

    def __init__(self, address: str, *, interval: float, stuck_after: float):
        self.host, self.port = _host_port(address)
        self.interval, self.stuck_after = interval, stuck_after
        self.answered_at = monotonic() + START_GRACE
        self._stop = threading.Event()

    def serving(self) -> bool:
        return monotonic() - self.answered_at < self.stuck_after

    def probe(self) -> bool:
        """One probe; True (and the time noted) when it came back 204 in time."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.stuck_after)
        try:
            conn.request("GET", PATH)
            answered = conn.getresponse().status == 204
        except (OSError, http.client.HTTPException):
            answered = False
        finally:
            conn.close()
        if answered:
            self.answered_at = monotonic()  # (the start-up grace ends at the first answer)
        return answered

    def start(self) -> Watchdog:
        threading.Thread(target=self._run, name="serving-watchdog", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        was = True
        while not self._stop.wait(self.interval):
            self.probe()
            now = self.serving()
            if now != was:
                log.warning(
                    "this process %s calls (its own probe at %s:%s)",
                    "answers" if now else "does not answer",
                    self.host,
                    self.port,
                )
                was = now
