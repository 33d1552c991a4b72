"""Whether a node process still answers calls: a probe of itself, through its own server.

A process holds leases for as long as its lease thread renews them, and that thread runs
whatever the request threads do. When every request thread is stuck (each waiting on a client
that trickles its body, say), the process serves nobody and yet keeps its partitions: no
other node may take them over. So each served process sends itself a small call every
``interval`` seconds, at the address it registered (``Node.address``: its own listener), and
:meth:`Watchdog.serving` says no once a probe has gone ``NODE_STUCK_AFTER`` seconds unanswered.
The call takes the way every call does (granian's queue, a request thread), and is answered
before Django (:class:`ServingProbe`): no database, no store, no lock of the node; only a free
request thread. While the answer is no, the runtime gives its leases up and claims none, and
stops its heartbeat (``NodeRuntime.renew``); when calls are answered again it joins as before.

The probes share one kept-alive connection. The server takes at most its backpressure of
connections at once (``runnode``: four per request thread), idle kept-alive ones included, and
leaves the next ones unaccepted until some close: a probe on a new connection then goes
unanswered though every request thread is free, and a node with that many idle clients would
give its leases up. So only a connection that has answered once can say "stuck"; a new one that
times out says nothing (it may wait for a slot), and the next probe tries a new one again.
The kept connection is used every ``interval``, so it seldom sits idle; were it
lost (a reset) just as every thread got stuck, that would go unseen until a new one answered.
"""

from __future__ import annotations

import http.client
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

#: the probe's path, answered 204 by :class:`ServingProbe` (GET only; nothing else there).
PATH = "/-/alive"


class ServingProbe:
    """WSGI middleware, outermost: ``GET /-/alive`` answers 204 with nothing, from whatever
    request thread picks it up."""

    def __init__(self, app: Any):
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == PATH and environ.get("REQUEST_METHOD") == "GET":
            start_response("204 No Content", [("Cache-Control", "no-store")])
            return [b""]
        return self.app(environ, start_response)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    return ("127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host), int(port)  # noqa: S104 - recognises a bind-all address, binds nothing


class Watchdog:
    """Probes ``address`` every ``interval`` seconds; :meth:`serving` is False from a probe that
    went unanswered for ``stuck_after`` seconds, on the connection that answered the one before,
    until one is answered.

    Only a probe's own timeout says "stuck", never the time since the last answer: a process
    paused and woken (SIGSTOP, a VM's stall) sees no probe time out and keeps its leases, as
    before, instead of giving them up for a pause its lease may well have outlived anyway."""

    def __init__(self, address: str, *, interval: float, stuck_after: float):
        self.host, self.port = _host_port(address)
        self.interval, self.stuck_after = interval, stuck_after
        self.stuck = False
        self._stop = threading.Event()
        #: the probes' connection, once it has answered (None: the next probe opens one).
        self._conn: http.client.HTTPConnection | None = None

    def serving(self) -> bool:
        return not self.stuck

    def probe(self) -> bool | None:
        """One probe: True when answered 204, False when it timed out on the connection that
        answered the last one, None when it could not tell (refused, reset: the server starting
        or stopping; or a new connection that timed out, perhaps never accepted)."""
        conn, proven = self._conn, self._conn is not None
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.stuck_after)
        self._conn = None
        try:
            conn.request("GET", PATH)
            response = conn.getresponse()
            response.read()
            answered: bool | None = response.status == 204
            if not response.will_close:
                self._conn, conn = conn, None  # kept for the next probe
        except TimeoutError:
            answered = False if proven else None
        except (OSError, http.client.HTTPException):
            answered = None
        finally:
            if conn is not None:
                conn.close()
        if answered is not None and answered == self.stuck:
            self.stuck = not answered
            log.warning(
                "this process %s calls (its own probe at %s:%s)",
                "answers" if answered else "does not answer",
                self.host,
                self.port,
            )
        return answered

    def start(self) -> Watchdog:
        threading.Thread(target=self._run, name="serving-watchdog", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.probe()
