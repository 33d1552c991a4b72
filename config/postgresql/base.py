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
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base


class DeadlineConnection(psycopg.Connection):
    """A psycopg connection whose every wait for the server has a deadline."""

    def wait(self, gen, interval=0.1, timeout=None):  # type: ignore[no-untyped-def,override]
        deadline = settings.DB_CALL_TIMEOUT or None
        try:
            return super().wait(gen, interval=interval, timeout=timeout if timeout is not None else deadline)
        except psycopg.errors._WaitTimeout as exc:
            self.pgconn.finish()  # a query may still be running there: never reuse this connection
            raise psycopg.OperationalError(f"the database did not answer within {deadline} s") from exc


class _Psycopg:
    """The psycopg module as Django's backend uses it, except that connections are opened as
    :class:`DeadlineConnection`."""

    connect = DeadlineConnection.connect

    def __getattr__(self, name: str) -> Any:
        return getattr(psycopg, name)


class DatabaseWrapper(base.DatabaseWrapper):
    Database = _Psycopg()
