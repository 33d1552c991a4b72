"""The active access key a call names: read from the database with one plain query, and kept
in the process while the store's credentials stamp says nothing changed.

Every process of a cluster shares the key-value store (``KV_URL``). A change to a key or to a
user (a key revoked, its user made inactive or deleted; any save of either but a key's last
use or description) writes a new *credentials stamp* there (:data:`STAMP`): once before the
write, so that a store that cannot be reached fails the write rather than leave the other
processes trusting the old rows, and again once it commits. A process trusts a key it read
under the stamp it holds; under another it reads the key and its user again (and while the
store does not answer, it reads them and keeps nothing).

A process holds the stamp it read on a *lease*, counted on its clock (``CLOCK_BOOTTIME``,
which runs through a suspend) from before the read was sent: the calls within it read no
stamp. A stamp names the longest lease any process may take on it (its writer's
``SQS_KEY_LEASE``; a process takes the shorter of that and its own), and each announcement
waits, from its write's answer, for the leases on the stamp it replaced to run out (the
longer of that stamp's lease and the writer's own, and a margin for clock rates); the change
returns once its announcements' waits are over, as a cache's lease bounds an invalidation in
Chubby (Burrows, OSDI 2006, section 2.8). So a key revoked, or its user made inactive, is
refused from the next call after the change returns, on every node and in every process, as
when the rows were read on every call; a change that bypasses the models' saves (a
queryset's ``update()``, SQL by hand) is seen within :data:`MAX_AGE`, or at once after
:func:`forget`. A stamp an earlier version wrote (no lease named) or none at all is read on
every call (a process writes the first one); ``SQS_KEY_LEASE=0`` reads it on every call.
Give every process of a cluster, its management commands and shells too, the same lease.

The query is a plain one (no ORM query built): its columns are all a call needs (the secret to
check the signature, the user it acts as, its last use).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
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
#: The longest ``SQS_KEY_LEASE`` may be (seconds): a change's announcement waits for it.
MAX_LEASE = 5.0
#: How much faster one process's clock may run than another's (a fraction): the announcement
#: waits this much longer than the lease, and ``_WAIT_MARGIN`` seconds more.
_CLOCK_RATE = 0.01
_WAIT_MARGIN = 0.005
#: A stamp: ``v2 <the longest lease on it, ms> <random hex>``.
_STAMP_FORM = re.compile(rb"v2 (\d{1,5}) [0-9a-f]{32}")

if hasattr(time, "CLOCK_BOOTTIME"):

    def _now() -> float:
        """Seconds on a clock that never goes back and runs through a suspend (Linux)."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)

else:  # pragma: no cover - not Linux
    _now = time.monotonic


def lease_seconds() -> float:
    """How long this process holds a stamp it read (``SQS_KEY_LEASE``, within 0 and
    :data:`MAX_LEASE`), at most."""
    return min(max(float(settings.SQS_KEY_LEASE), 0.0), MAX_LEASE)


def new_stamp() -> bytes:
    """A new stamp that names this process's lease as the longest any process may take on it."""
    return b"v2 %d %s" % (round(lease_seconds() * 1000), uuid.uuid4().hex.encode())


def stamp_lease(stamp: bytes | None) -> float:
    """The longest lease a process may take on ``stamp`` (seconds): 0 for none, or for one an
    earlier version wrote (random bytes: it knows no lease)."""
    found = _STAMP_FORM.fullmatch(stamp) if stamp is not None else None
    return int(found[1]) / 1000 if found else 0.0


def in_force_after(lease: float) -> float:
    """Seconds after a stamp's write answers until no process holds a lease of ``lease``
    seconds on an older one: the lease, and a margin for clocks that run at different rates."""
    return lease * (1 + _CLOCK_RATE) + _WAIT_MARGIN if lease > 0 else 0.0


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

#: access key ID -> (the stamp it was read under, when (:func:`_now`), the key).
_cache: dict[str, tuple[bytes | None, float, ActiveKey]] = {}
_lock = threading.Lock()
#: (the stamp read, until when (:func:`_now`) it is held): the process's lease, None: none held.
_lease: tuple[bytes | None, float] | None = None


def _stamp(now: float) -> bytes | None:
    """The stamp the process holds at ``now`` (:func:`_now`), read from the store when its
    lease has run out. Raises Unavailable (the store)."""
    global _lease
    held = _lease
    if held is not None and now < held[1]:
        return held[0]
    stamp = service.credentials_stamp(STAMP)  # (the lease counts from before the read was sent)
    if stamp is None:
        # None written yet (no change since the store began): the first, naming this process's
        # lease; this call holds none (the next one reads what was written)
        service.initialize_credentials_stamp(STAMP, new_stamp())
    lease = min(lease_seconds(), stamp_lease(stamp))
    if lease > 0:
        _lease = (stamp, now + lease)
    return stamp


def active_key(access_key_id: str) -> ActiveKey | None:
    """The active key ``access_key_id`` of an active user, as the rows read now would say
    (kept while the credentials stamp is unchanged, at most ``MAX_AGE``); None if there is
    none (never kept: a key issued a moment ago is found at once); read from the rows alone
    while the store does not answer. Raises ``DatabaseError``."""
    if not access_key_id or len(access_key_id) > ACCESS_KEY_ID_MAX:
        return None
    # The stamp before the rows: a change that commits after this read writes a newer stamp,
    # so what is kept under this one is read again once the lease on it runs out, which the
    # change's announcement waits for.
    now = _now()
    try:
        stamp = _stamp(now)
    except Unavailable:
        # The store out of reach: the rows, read now and not kept (a call that needs no store,
        # a receive from no partition served here, is answered as before).
        return _read(access_key_id)
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
    """Forget the keys read in this process and the stamp it holds (the next call reads both
    again)."""
    global _lease
    with _lock:
        _lease = None
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


#: Per thread: until when (:func:`_now`) a lease on a stamp its announcements replaced may run
#: (``due``), and whether a bulk change waits for it at its end (``deferred``).
_waits = threading.local()


def announce_change() -> None:
    """Write a new credentials stamp: every process reads its keys again once the lease on the
    stamp it holds runs out. Notes, for this thread's change to wait for, when the leases on the
    stamp it replaced run out (:func:`in_force_after` of the longer of that stamp's lease and
    this process's own, from the write's answer). Raises ``Unavailable`` (the store)."""
    replaced = service.credentials_stamp(STAMP)
    service.announce_credentials_change(STAMP, new_stamp())
    due = _now() + in_force_after(max(stamp_lease(replaced), lease_seconds()))
    _waits.due = max(getattr(_waits, "due", 0.0), due)


@contextmanager
def changes_in_force_at_exit() -> Iterator[None]:
    """Within it, a committed change's announcement does not wait for the leases to run out;
    its exit waits once for all of them (a bulk revoke in the admin or the command: one wait,
    not one a key), also when it ends with an exception."""
    outer = getattr(_waits, "deferred", False)
    _waits.deferred = True
    try:
        yield
    finally:
        if not outer:
            _waits.deferred = False
            _wait_in_force()


def _wait_in_force() -> None:
    """Wait until the leases on the stamps this thread's announcements replaced have run out."""
    due, _waits.due = getattr(_waits, "due", 0.0), 0.0
    _sleep_until(due)


def _sleep_until(until: float) -> None:
    left = until - _now()
    while left > 0:
        time.sleep(left)
        left = until - _now()


def _announce_committed() -> None:
    try:
        announce_change()
    except Exception:
        # The write before it went through (or it failed the change): a key read between the two
        # is kept, at most MAX_AGE; the leases on the stamp before it are still waited for.
        log.exception("SQS credentials changed, but their stamp could not be written after the commit")
    forget()
    # The change returns once no process holds a lease on a stamp its announcements replaced.
    if not getattr(_waits, "deferred", False):
        _wait_in_force()


def _changes_use(sender: Any, instance: Any, update_fields: Any) -> bool:
    if getattr(instance, "_state", None) is not None and instance._state.adding:
        return False  # a new row: no process holds it
    unused = _KEY_FIELDS_UNUSED if sender is AccessKey else _USER_FIELDS_UNUSED
    return update_fields is None or not set(update_fields) <= unused


def _before_save(sender: Any, instance: Any, update_fields: Any = None, **_: Any) -> None:
    if _changes_use(sender, instance, update_fields):
        announce_change()


def _once_committed() -> None:
    """Announce the change once its transaction commits: once a transaction, however many rows
    it changes (a user deleted with its keys waits for the leases once)."""
    conn = transaction.get_connection()
    # (Django's list of the transaction's hooks: a hook of a savepoint rolled back is gone from
    # it, and so is every change made within that savepoint)
    if conn.in_atomic_block and any(hook[1] is _announce_committed for hook in getattr(conn, "run_on_commit", ())):
        return
    transaction.on_commit(_announce_committed)


def _after_save(sender: Any, instance: Any, created: bool = False, update_fields: Any = None, **_: Any) -> None:
    if not created and _changes_use(sender, instance, update_fields):
        _once_committed()


def _before_delete(sender: Any, instance: Any, **_: Any) -> None:
    announce_change()


def _after_delete(sender: Any, instance: Any, **_: Any) -> None:
    _once_committed()


def connect() -> None:
    """Announce every change of a key or a user (``SqsConfig.ready``)."""
    for model in (AccessKey, get_user_model()):
        label = f"sqs.keys.{model._meta.label_lower}"
        pre_save.connect(_before_save, sender=model, dispatch_uid=f"{label}.pre_save")
        post_save.connect(_after_save, sender=model, dispatch_uid=f"{label}.post_save")
        pre_delete.connect(_before_delete, sender=model, dispatch_uid=f"{label}.pre_delete")
        post_delete.connect(_after_delete, sender=model, dispatch_uid=f"{label}.post_delete")
