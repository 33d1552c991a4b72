"""The active access key a call names, read on every call with one plain query.

A key revoked, or its user made inactive, is refused from the next call on, on every node and
in every process: the key and its user are read from the database each time, never cached.
The query is a plain one (no ORM query built): its columns are all a call needs (the secret to
check the signature, the user it acts as, its last use).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from sqs.models import ACCESS_KEY_ID_MAX, LAST_USED_RESOLUTION, AccessKey


@dataclass
class ActiveKey:
    """An active key of an active user, as one call uses it."""

    pk: int
    access_key_id: str
    secret: str
    user_id: int
    last_used_at: datetime | None

    def touch(self) -> None:
        """Record a use, at most once per ``LAST_USED_RESOLUTION`` (as ``AccessKey.touch``)."""
        now = timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() >= LAST_USED_RESOLUTION:
            AccessKey.objects.filter(pk=self.pk, last_used_at=self.last_used_at).update(last_used_at=now)
            self.last_used_at = now


def _query() -> str:
    keys = AccessKey._meta.db_table
    users = get_user_model()._meta.db_table
    return (
        f'SELECT k."id", k."secret", k."user_id", k."last_used_at" FROM "{keys}" k '  # noqa: S608 - table names from the models, the key ID a parameter
        f'JOIN "{users}" u ON u."id" = k."user_id" '
        'WHERE k."access_key_id" = %s AND k."revoked_at" IS NULL AND u."is_active"'
    )


_QUERY: str | None = None


def active_key(access_key_id: str) -> ActiveKey | None:
    """The active key ``access_key_id`` of an active user, read now; None if there is none."""
    global _QUERY
    if not access_key_id or len(access_key_id) > ACCESS_KEY_ID_MAX:
        return None
    if _QUERY is None:
        _QUERY = _query()
    with connection.cursor() as cursor:
        cursor.execute(_QUERY, [access_key_id])
        row = cursor.fetchone()
    if row is None:
        return None
    pk, secret, user_id, last_used_at = row
    if isinstance(last_used_at, datetime) and timezone.is_naive(last_used_at):
        # SQLite's raw rows are naive (UTC, as Django stores them); PostgreSQL's are aware.
        last_used_at = timezone.make_aware(last_used_at, UTC)
    return ActiveKey(pk, access_key_id, secret, user_id, last_used_at)
