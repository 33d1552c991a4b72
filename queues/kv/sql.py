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
from typing import TYPE_CHECKING

from django.db import DatabaseError, connection, transaction

from .base import Fence, Fenced, KeyValueStore, KVError, split_key

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

TABLE = "queues_kv_entry"


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

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys:
            return []
        pairs = [split_key(k) for k in keys]
        found: dict[tuple[str, str], bytes] = {}
        try:
            with connection.cursor() as cursor:
                if self.vendor == "postgresql":
                    cursor.execute(
                        f"SELECT e.bucket, e.name, e.value FROM {TABLE} e "
                        "JOIN unnest(%s::text[], %s::text[]) AS k(bucket, name) "
                        "ON e.bucket = k.bucket AND e.name = k.name",
                        [[b for b, _ in pairs], [n for _, n in pairs]],
                    )
                    rows = cursor.fetchall()
                else:
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
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                self._check_fence(cursor, fence)
                if self.vendor == "postgresql":
                    cursor.execute(
                        f"DELETE FROM {TABLE} e USING unnest(%s::text[], %s::text[]) "
                        "AS k(bucket, name) WHERE e.bucket = k.bucket AND e.name = k.name",
                        [[b for b, _ in pairs], [n for _, n in pairs]],
                    )
                    return cursor.rowcount
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
                return cursor.rowcount == 1
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
