"""The database backend: a table in the default database (``KV_URL=postgres``).

Rows are ``(bucket, name, value)`` with the primary key ``(bucket, name)``, so a scan of a
block is an index range read. Each batch is one transaction. A fenced batch first reads the
fence row ``FOR SHARE`` (PostgreSQL): raising the fence is an UPDATE of that row, which waits
for the batches holding the share lock and is seen by every batch after it. On SQLite the
whole transaction holds the database write lock (``transaction_mode=IMMEDIATE``), which
gives the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from django.db import DatabaseError, connection, transaction

from queues.kv.base import Fence, Fenced, KeyValueStore, KVError, split_key

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

TABLE = "queues_kv_entry"

# One statement each (see SQLStore._one_statement). Parameters, all sent in binary (``%b``: see
# SQLStore._server_bound): the fence's bucket and name, the columns, "unfenced", the epoch. A
# write happens only if unfenced or the fence row holds the epoch (as a number: _check_fence
# compares int(value)); the statement returns the fence's value and the rows written.
_FENCE = f"""
WITH fence AS (SELECT value FROM {TABLE} WHERE bucket = %b AND name = %b FOR SHARE)"""
_FENCE_HOLDS = "(%b OR EXISTS (SELECT 1 FROM fence WHERE convert_from(fence.value, 'UTF8')::bigint = %b))"
_PUT = f"""{_FENCE}, written AS (
  INSERT INTO {TABLE} (bucket, name, value)
  SELECT k.bucket, k.name, k.value FROM unnest(%b::text[], %b::text[], %b::bytea[]) AS k(bucket, name, value)
  WHERE {_FENCE_HOLDS}
  ON CONFLICT (bucket, name) DO UPDATE SET value = EXCLUDED.value
  RETURNING 1
)
SELECT (SELECT value FROM fence), (SELECT count(*) FROM written)"""
_DELETE = f"""{_FENCE}, removed AS (
  DELETE FROM {TABLE} e USING unnest(%b::text[], %b::text[]) AS k(bucket, name)
  WHERE e.bucket = k.bucket AND e.name = k.name AND {_FENCE_HOLDS}
  RETURNING 1
)
SELECT (SELECT value FROM fence), (SELECT count(*) FROM removed)"""


class SQLStore(KeyValueStore):
    schemes = ("postgres", "postgresql", "sql")

    def __init__(self) -> None:
        self.vendor = connection.vendor

    def _check_fence(self, cursor: CursorWrapper, fence: Fence | None) -> None:
        if fence is None:
            return
        bucket, name = split_key(fence.key)
        lock = " FOR SHARE" if self.vendor == "postgresql" else ""
        cursor.execute(f"SELECT value FROM {TABLE} WHERE bucket = %s AND name = %s{lock}", [bucket, name])
        row = cursor.fetchone()
        current = bytes(row[0]) if row else None
        if current is None or int(current) != fence.epoch:
            raise Fenced(f"{fence.key}: epoch {fence.epoch} is not current ({current!r})")

    @staticmethod
    def _server_bound(statement: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """``statement``'s rows, its parameters bound by the server (PostgreSQL only).

        Django's PostgreSQL cursors bind parameters on the client: psycopg then quotes every
        element of the arrays a batch sends (names, bodies) in Python, a regular expression or
        two each, and so does a server-bound cursor for a parameter in text format. The
        statements here mark their parameters ``%b``: sent in binary, arrays of names and
        bodies cost psycopg a fraction of the CPU.
        Django's error wrapping maps psycopg's errors to Django's as for every other query.
        They are prepared on the connection at their first run (``DB_PREPARED_STATEMENTS``;
        settings.py): planning a put or a delete of 100 rows costs PostgreSQL more CPU than
        running it.

        The connection is not health-checked first: Django's ``CONN_HEALTH_CHECKS`` would send
        a ``SELECT 1`` before a request's first statement, a round trip to the database on
        every message call, as long as the write itself. A kept connection the server closed
        since (a restart) is found by the statement instead, which then runs once more on a
        new connection: the statements here leave what the first run left (a put writes the
        same values, a delete finds fewer to delete, a read reads again), and a connection
        that died while its statement ran may or may not have committed it, which the retry
        makes no worse. Not inside a transaction (its work would be lost), and never on a
        connection opened for this statement."""
        for attempt in (1, 2):
            reused = connection.connection is not None
            with connection.wrap_database_errors:
                connection.ensure_connection()
                connection.validate_no_broken_transaction()
                raw = connection.connection
                try:
                    with psycopg.Cursor(raw) as cursor:
                        cursor.execute(statement, params, prepare=True)
                        return cursor.fetchall()
                except psycopg.OperationalError:
                    if attempt == 2 or not reused or not raw.closed or connection.in_atomic_block:
                        raise
            connection.close()  # the server closed it since its last use: a new one
        raise AssertionError("unreachable")

    def _one_statement(self, statement: str, columns: list[list[Any]], fence: Fence | None) -> int:
        """A fenced write as ONE statement (PostgreSQL, outside a transaction): the fence row
        is read ``FOR SHARE`` and the rows written only if it holds the epoch, in one round trip
        instead of four (BEGIN, the fence's SELECT, the write, COMMIT), which cost the node
        more CPU than the write itself. The lock is held to the end of the statement's own
        transaction, so a fence raised meanwhile waits for it, as with :meth:`_check_fence`.
        Returns the rows written; raises Fenced (nothing written) as :meth:`_check_fence`."""
        bucket, name = split_key(fence.key) if fence is not None else ("", "")
        epoch = fence.epoch if fence is not None else None
        try:
            ((current, count),) = self._server_bound(statement, [bucket, name, *columns, epoch is None, epoch])
        except DatabaseError as exc:
            raise KVError(f"database: {exc}") from exc
        if fence is not None:
            value = bytes(current) if current is not None else None
            if value is None or int(value) != fence.epoch:
                raise Fenced(f"{fence.key}: epoch {fence.epoch} is not current ({value!r})")
        return int(count)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        pairs = [split_key(k) for k in keys]
        found: dict[tuple[str, str], bytes] = {}
        try:
            if self.vendor == "postgresql":
                rows = self._server_bound(
                    f"SELECT e.bucket, e.name, e.value FROM {TABLE} e "
                    "JOIN unnest(%b::text[], %b::text[]) AS k(bucket, name) "
                    "ON e.bucket = k.bucket AND e.name = k.name",
                    [[b for b, _ in pairs], [n for _, n in pairs]],
                )
            else:
                with connection.cursor() as cursor:
                    rows = []
                    for start in range(0, len(pairs), 400):
                        chunk = pairs[start : start + 400]
                        where = " OR ".join(["(bucket = %s AND name = %s)"] * len(chunk))
                        cursor.execute(
                            f"SELECT bucket, name, value FROM {TABLE} WHERE {where}",
                            [x for pair in chunk for x in pair],
                        )
                        rows.extend(cursor.fetchall())
        except DatabaseError as exc:
            raise KVError(f"database: {exc}") from exc
        for bucket, name, value in rows:
            found[(bucket, name)] = bytes(value)
        return [found.get(p) for p in pairs]

    def put_many(self, items: Sequence[tuple[str, bytes]], *, fence: Fence | None = None) -> None:
        if not items:
            return
        # A key given twice: the last value wins, as in the other backends (PostgreSQL's
        # ON CONFLICT DO UPDATE refuses to touch one row twice in a statement).
        latest = {split_key(k): v for k, v in items}
        rows = [(b, n, v) for (b, n), v in latest.items()]
        if self.vendor == "postgresql" and not connection.in_atomic_block:
            columns: list[list[Any]] = [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]]
            self._one_statement(_PUT, columns, fence)
            return
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                self._check_fence(cursor, fence)
                if self.vendor == "postgresql":
                    cursor.execute(
                        f"INSERT INTO {TABLE} (bucket, name, value) "
                        "SELECT * FROM unnest(%s::text[], %s::text[], %s::bytea[]) "
                        "ON CONFLICT (bucket, name) DO UPDATE SET value = EXCLUDED.value",
                        [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]],
                    )
                else:
                    cursor.executemany(
                        f"INSERT INTO {TABLE} (bucket, name, value) VALUES (%s, %s, %s) "
                        "ON CONFLICT (bucket, name) DO UPDATE SET value = excluded.value",
                        rows,
                    )
        except DatabaseError as exc:
            raise KVError(f"database: {exc}") from exc

    def delete_many(self, keys: Sequence[str], *, fence: Fence | None = None) -> int:
        if not keys:
            return 0
        pairs = [split_key(k) for k in keys]
        if self.vendor == "postgresql" and not connection.in_atomic_block:
            return self._one_statement(_DELETE, [[b for b, _ in pairs], [n for _, n in pairs]], fence)
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                self._check_fence(cursor, fence)
                if self.vendor == "postgresql":
                    cursor.execute(
                        f"DELETE FROM {TABLE} e USING unnest(%s::text[], %s::text[]) "
                        "AS k(bucket, name) WHERE e.bucket = k.bucket AND e.name = k.name",
                        [[b for b, _ in pairs], [n for _, n in pairs]],
                    )
                    deleted: int = cursor.rowcount
                    return deleted
                removed = 0
                for bucket, name in pairs:
                    cursor.execute(f"DELETE FROM {TABLE} WHERE bucket = %s AND name = %s", [bucket, name])
                    removed += cursor.rowcount
                return removed
        except DatabaseError as exc:
            raise KVError(f"database: {exc}") from exc

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        bucket, name = split_key(key)
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if expected is None:
                    cursor.execute(
                        f"INSERT INTO {TABLE} (bucket, name, value) VALUES (%s, %s, %s) "
                        "ON CONFLICT (bucket, name) DO NOTHING",
                        [bucket, name, value],
                    )
                else:
                    cursor.execute(
                        f"UPDATE {TABLE} SET value = %s WHERE bucket = %s AND name = %s AND value = %s",
                        [value, bucket, name, expected],
                    )
                written: int = cursor.rowcount
                return written == 1
        except DatabaseError as exc:
            raise KVError(f"database: {exc}") from exc

    def scan(self, bucket: str) -> list[str]:
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT name FROM {TABLE} WHERE bucket = %s", [bucket])
                return [row[0] for row in cursor.fetchall()]
        except DatabaseError as exc:
            raise KVError(f"database: {exc}") from exc

    def delete_prefix(self, prefix: str) -> None:
        like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {TABLE} WHERE bucket = %s OR bucket LIKE %s ESCAPE '\\'",
                    [prefix, like],
                )
        except DatabaseError as exc:
            raise KVError(f"database: {exc}") from exc
