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
"""

from __future__ import annotations

import http.client
import logging
import threading
from time import monotonic
from typing import Any

log = logging.getLogger(__name__)

#: the probe's path, answered 204 by :class:`ServingProbe` (GET only; nothing else there).
PATH = "/-/alive"
#: seconds after the process starts in which a probe's timeout does not count until one probe
#: has been answered (its server takes calls a moment after the app is loaded).
START_GRACE = 15.0


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
    return ("127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host), int(port)


class Watchdog:
    """Probes ``address`` every ``interval`` seconds; :meth:`serving` is False from a probe that
    went unanswered for ``stuck_after`` seconds until one is answered.

    Only a probe's own timeout says "stuck", never the time since the last answer: a process
    paused and woken (SIGSTOP, a VM's stall) sees no probe time out and keeps its leases, as
    before, instead of giving them up for a pause its lease may well have outlived anyway."""

    def __init__(self, address: str, *, interval: float, stuck_after: float):
        self.host, self.port = _host_port(address)
        self.interval, self.stuck_after = interval, stuck_after
        self.stuck = False
        self._started = monotonic()
        self._answered_once = False
        self._stop = threading.Event()

    def serving(self) -> bool:
        return not self.stuck

    def probe(self) -> bool | None:
        """One probe: True when answered 204, False when it timed out, None when it could not
        tell (refused, reset: the server starting or stopping)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.stuck_after)
        try:
            conn.request("GET", PATH)
            answered: bool | None = conn.getresponse().status == 204
        except TimeoutError:
            # (the server takes its first calls a moment after this process starts)
            starting = not self._answered_once and monotonic() - self._started < START_GRACE
            answered = None if starting else False
        except (OSError, http.client.HTTPException):
            answered = None
        finally:
            conn.close()
        self._answered_once = self._answered_once or bool(answered)
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
