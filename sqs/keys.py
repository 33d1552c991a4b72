"""The active access key a call names: read from the database with one plain query, and kept
in the process while the store's credentials stamp says nothing changed.

Every process of a cluster shares the key-value store (``KV_URL``). A change to a key or to a
user (a key revoked, its user made inactive or deleted; any save of either but a key's last
use or description) writes a new *credentials stamp* there (:data:`STAMP`): once before the
write, so that a store that cannot be reached fails the write rather than leave the other
processes trusting the old rows, and again once it commits. A call reads the stamp (one read
of the store, as cheap as the store's smallest read) and trusts a key it read under the same
stamp; under another it reads the key and its user again (and while the store does not
answer, it reads them and keeps nothing). So a key revoked, or its user made
inactive, is refused from the next call on, on every node and in every process, as when the
rows were read on every call; a change that bypasses the models' saves (a queryset's
``update()``, SQL by hand) is seen within :data:`MAX_AGE`, or at once after :func:`forget`.

The query is a plain one (no ORM query built): its columns are all a call needs (the secret to
check the signature, the user it acts as, its last use).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models.signals import post_delete, post_save, pre_delete, pre_save
from django.utils import timezone

from queues import service
from queues.errors import Unavailable
from sqs.models import ACCESS_KEY_ID_MAX, LAST_USED_RESOLUTION, AccessKey

log = logging.getLogger(__name__)

#: The kind of the credentials stamp (``service.credentials_stamp``) of the SQS API's keys.
STAMP = "sqs"
#: The longest a key read is trusted under an unchanged stamp (seconds): the bound on a change
#: that wrote no stamp (a queryset's ``update()``, SQL by hand).
MAX_AGE = 10.0
#: The most keys a process keeps (past it, it forgets them all and reads them again).
MAX_KEYS = 10_000


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

#: access key ID -> (the stamp it was read under, when (monotonic), the key).
_cache: dict[str, tuple[bytes | None, float, ActiveKey]] = {}
_lock = threading.Lock()


def active_key(access_key_id: str) -> ActiveKey | None:
    """The active key ``access_key_id`` of an active user, as the rows read now would say
    (kept while the credentials stamp is unchanged, at most ``MAX_AGE``); None if there is
    none (never kept: a key issued a moment ago is found at once); read from the rows alone
    while the store does not answer. Raises ``DatabaseError``."""
    if not access_key_id or len(access_key_id) > ACCESS_KEY_ID_MAX:
        return None
    # The stamp before the rows: a change that commits after this read writes a newer stamp,
    # so what is kept under this one is read again by the next call.
    try:
        stamp = service.credentials_stamp(STAMP)
    except Unavailable:
        # The store out of reach: the rows, read now and not kept (a call that needs no store,
        # a receive from no partition served here, is answered as before).
        return _read(access_key_id)
    now = time.monotonic()
    hit = _cache.get(access_key_id)
    if hit is not None and hit[0] == stamp and now - hit[1] < MAX_AGE:
        return hit[2]
    key = _read(access_key_id)
    with _lock:
        if key is None:
            _cache.pop(access_key_id, None)
        else:
            if len(_cache) >= MAX_KEYS:
                _cache.clear()
            _cache[access_key_id] = (stamp, now, key)
    return key


def forget() -> None:
    """Forget the keys read in this process (the next call of each reads it again)."""
    with _lock:
        _cache.clear()


def _read(access_key_id: str) -> ActiveKey | None:
    """The active key ``access_key_id`` of an active user, read from the database now."""
    global _QUERY
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


# --- the credentials stamp ----------------------------------------------------------------------
#: The fields of a key whose change leaves its use as it was (``touch`` and a new description
#: write them with ``update()``: no signal; a ``save`` naming only these writes no stamp).
_KEY_FIELDS_UNUSED = frozenset({"last_used_at", "description"})
#: A user's fields that change nothing of a key's use (a login writes ``last_login``).
_USER_FIELDS_UNUSED = frozenset({"last_login"})


def announce_change() -> None:
    """Write a new credentials stamp: every process reads its keys again at its next call.
    Raises ``Unavailable`` (the store)."""
    service.announce_credentials_change(STAMP)


def _announce_committed() -> None:
    try:
        announce_change()
    except Exception:
        # The write before it went through (or it failed the change): only a key read between
        # the two is kept, at most MAX_AGE.
        log.exception("SQS credentials changed, but their stamp could not be written after the commit")
    forget()


def _changes_use(sender: Any, instance: Any, update_fields: Any) -> bool:
    if getattr(instance, "_state", None) is not None and instance._state.adding:
        return False  # a new row: no process holds it
    unused = _KEY_FIELDS_UNUSED if sender is AccessKey else _USER_FIELDS_UNUSED
    return update_fields is None or not set(update_fields) <= unused


def _before_save(sender: Any, instance: Any, update_fields: Any = None, **_: Any) -> None:
    if _changes_use(sender, instance, update_fields):
        announce_change()


def _after_save(sender: Any, instance: Any, created: bool = False, update_fields: Any = None, **_: Any) -> None:
    if not created and _changes_use(sender, instance, update_fields):
        transaction.on_commit(_announce_committed)


def _before_delete(sender: Any, instance: Any, **_: Any) -> None:
    announce_change()


def _after_delete(sender: Any, instance: Any, **_: Any) -> None:
    transaction.on_commit(_announce_committed)


def connect() -> None:
    """Announce every change of a key or a user (``SqsConfig.ready``)."""
    for model in (AccessKey, get_user_model()):
        label = f"sqs.keys.{model._meta.label_lower}"
        pre_save.connect(_before_save, sender=model, dispatch_uid=f"{label}.pre_save")
        post_save.connect(_after_save, sender=model, dispatch_uid=f"{label}.post_save")
        pre_delete.connect(_before_delete, sender=model, dispatch_uid=f"{label}.pre_delete")
        post_delete.connect(_after_delete, sender=model, dispatch_uid=f"{label}.post_delete")
