"""Django's PostgreSQL backend (psycopg 3), with a deadline on every call to the server.

A PostgreSQL that stops answering without closing its connections (a host paused or cut off
by the network; ``scripts/services.sh pause pg`` SIGSTOPs it in the tests) leaves a query
waiting for ever: the kernel on its side still acknowledges what is sent, so neither TCP
keepalives nor ``tcp_user_timeout`` fire, and ``statement_timeout`` is enforced by the server
that is not running. A request would hang past any client's timeout, holding a partition's
lock (the head pointer is written under it) and every call queued behind it.

So each wait for the server ends after ``DB_CALL_TIMEOUT`` seconds: psycopg's own wait
raises, the connection is closed (its state is unknown: a query may still run there), and the
call fails with ``OperationalError``, which the API answers with 503 and ``Retry-After``.
Django drops the closed connection at the end of the request and the next one reconnects
(``connect_timeout`` bounds that too). ``DB_CALL_TIMEOUT=0`` waits without a deadline.

The health check Django runs before a request's first query (``CONN_HEALTH_CHECKS``: a
``SELECT 1`` round trip) is skipped for a connection that answered less than
``HEALTH_CHECK_IDLE`` seconds ago: a batch enqueue's head pointer write would pay a second
round trip for it, on a connection in use a moment before.
Unless its socket has something to read: between requests the server says nothing unasked
but that it is closing the session (a restart's or ``pg_terminate_backend``'s "terminating
connection"), so a readable socket (one ``poll``, no round trip) is checked as any other. A
connection the server cuts while the request is on its way fails its query, which is answered
503 like any outage, and is checked at the next request (Django checks a connection that had
an error).

After a call timed out (or a connection took its whole timeout to fail), every call of the
process fails at once for ``HOLD_DOWN`` seconds, then one call alone tries the server while
the others still fail at once: calls made under a partition's lock would otherwise wait one
deadline each, one after the other, and hold every call behind them past its client's
patience. A refused connection (a restart) fails fast by itself and changes nothing here.

This module is the one place that relies on psycopg's and Django's PostgreSQL backend's
internals. On an upgrade, check (checked against psycopg==3.3.9 and Django==5.2.19, pinned in
requirements.txt):

- psycopg: ``Connection.wait(gen, interval, timeout)``, through which every wait for the
  server goes (overridden by :class:`DeadlineConnection`), and ``psycopg.errors._WaitTimeout``,
  what it raises when ``timeout`` passes;
- Django: ``DatabaseWrapper.Database`` (the module the backend opens connections with),
  ``init_connection_state``, ``close_if_health_check_failed`` and ``health_check_done``.

``tests/unit/test_glue.py`` fails if one of them is gone or its parameters changed.
"""

from __future__ import annotations

import math
import select
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base

if TYPE_CHECKING:
    from psycopg.abc import RV, PQGen

#: What psycopg's ``Connection.wait`` raises when its ``timeout`` passes (a private name).
WaitTimeout: type[psycopg.OperationalError] = psycopg.errors._WaitTimeout

#: Seconds every call fails at once after one met an unreachable server.
HOLD_DOWN = 1.0
#: A connection attempt that failed after this long met an unreachable server (a refused one
#: fails in milliseconds).
SLOW_FAILURE = 1.0
#: Seconds since a connection's last answer within which it is trusted without a health check.
HEALTH_CHECK_IDLE = 1.0


class _Unreachable:
    """The process's knowledge that the server does not answer (see the module's docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.until = 0.0
        self.probing = False

    def admit(self) -> bool:
        """Let a call through (True: it is the one probing the server), or fail it at once."""
        with self.lock:
            if not self.until:
                return False
            if self.probing or time.monotonic() < self.until:
                raise psycopg.OperationalError("the database is not answering (a call timed out a moment ago); retry")
            self.probing = True
            return True

    def settle(self, probe: bool, *, unreachable: bool) -> None:
        with self.lock:
            if probe:
                self.probing = False
            if unreachable:
                self.until = time.monotonic() + HOLD_DOWN
            elif probe:
                self.until = 0.0


UNREACHABLE = _Unreachable()


class DeadlineConnection(psycopg.Connection):
    """A psycopg connection whose every wait for the server has a deadline."""

    #: monotonic time of the server's last answer on this connection.
    answered_at = float("-inf")

    @classmethod
    def connect(cls, *args: Any, **kwargs: Any) -> DeadlineConnection:
        probe = UNREACHABLE.admit()
        started = time.monotonic()
        try:
            conn = super().connect(*args, **kwargs)
        except psycopg.OperationalError:
            UNREACHABLE.settle(probe, unreachable=time.monotonic() - started >= SLOW_FAILURE)
            raise
        except BaseException:
            UNREACHABLE.settle(probe, unreachable=False)
            raise
        UNREACHABLE.settle(probe, unreachable=False)
        return conn

    def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        if timeout is not None:  # psycopg's own bounded waits (a cancellation)
            return super().wait(gen, interval=interval, timeout=timeout)
        deadline = settings.DB_CALL_TIMEOUT or None
        probe = UNREACHABLE.admit()
        try:
            result = super().wait(gen, interval=interval, timeout=deadline)
        except WaitTimeout as exc:
            UNREACHABLE.settle(probe, unreachable=True)
            self.pgconn.finish()  # a query may still be running there: never reuse this connection
            raise psycopg.OperationalError(f"the database did not answer within {deadline} s") from exc
        except BaseException:
            UNREACHABLE.settle(probe, unreachable=False)
            raise
        UNREACHABLE.settle(probe, unreachable=False)
        self.answered_at = time.monotonic()
        return result


class _Psycopg(ModuleType):
    """The psycopg module as Django's backend uses it, except that connections are opened as
    :class:`DeadlineConnection`."""

    connect = DeadlineConnection.connect

    def __getattr__(self, name: str) -> Any:
        return getattr(psycopg, name)


class DatabaseWrapper(base.DatabaseWrapper):
    Database = _Psycopg("psycopg")
    health_check_done: bool  # Django's, set in its __init__

    def init_connection_state(self) -> None:
        """Django's, and: the statements prepared on this connection (only the key-value store's
        are: ``DB_PREPARED_STATEMENTS``) always run their generic plan. PostgreSQL's own choice
        compares the generic plan with the custom plans made so far, and a store's statement
        that ran for single messages first (custom plans of one row, cheaper) would be planned
        on every run after, batches of 100 included (queues/kv/sql.py)."""
        super().init_connection_state()
        conn = self.connection
        if conn is not None and conn.prepare_threshold is not None:
            with conn.cursor() as cursor:
                cursor.execute("SET plan_cache_mode = force_generic_plan")
            if not self.get_autocommit():
                conn.commit()

    def close_if_health_check_failed(self) -> None:
        conn = self.connection
        if (
            conn is not None
            and not self.health_check_done
            and time.monotonic() - getattr(conn, "answered_at", -math.inf) < HEALTH_CHECK_IDLE
            and not _said_something(conn)
        ):
            self.health_check_done = True  # it answered a moment ago (see the module's docstring)
            return
        super().close_if_health_check_failed()


def _said_something(conn: psycopg.Connection) -> bool:
    """Whether an idle connection's socket has something to read, or is gone: the server spoke
    unasked (it is closing the session), so the connection is checked before it is used."""
    if conn.closed:
        return True
    try:
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))
    except (psycopg.Error, OSError, ValueError):
        return True  # no socket to look at: let the health check find out
