"""Enqueue on commit: messages sent only if the caller's database transaction commits.

:func:`enqueue_on_commit` takes the SDK's messages (``mq_client``; the SDK itself imports no
Django) and sends them after the transaction of ``using`` commits, never when it rolls back.
Outside a transaction (autocommit) they are sent at once, as ``transaction.on_commit`` does.

How, by the application's database:

- **PostgreSQL** (the transactional outbox): an :class:`~workers.models.OutboxMessage` row is
  written in the caller's transaction; after the commit the same process sends it and deletes
  the row. A process that dies between its commit and the send leaves the row, and a relay
  (:func:`relay`, run by ``manage.py mq_tasks_worker``) sends it once it is ``relay_after``
  seconds old. Each message carries a ``dedup_id`` (the row's, unless the caller gave one), so a
  send whose answer was lost and is sent again by the relay within the queue's dedup window is
  stored once. The sender and the relay lock the row (``FOR UPDATE SKIP LOCKED``): one of
  them sends it.
- **Any other database** (SQLite, MySQL...): ``transaction.on_commit`` alone. Nothing is sent
  on a rollback, but a process that dies after its commit and before the send loses the
  messages, and a send that fails after the commit raises from the commit (the transaction
  stands).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import F
from django.utils import timezone

from mq_client import ApiError, Client
from mq_client.types import MessageItem, message_json
from workers.models import OutboxMessage

log = logging.getLogger(__name__)

#: Seconds an outbox row waits for the process that wrote it before a relay sends it.
RELAY_AFTER = 10.0


_default_client: Client | None = None


def default_client() -> Client:
    """The process's client of the service from ``QUEUE_API_URL`` and ``QUEUE_API_TOKEN``."""
    global _default_client
    if _default_client is None:
        _default_client = Client.from_env()
    return _default_client


def outbox_used(using: str = "default", outbox: bool | None = None) -> bool:
    """Whether enqueues of ``using`` go through the outbox: ``outbox``, or (None) PostgreSQL only
    (the others have no ``SKIP LOCKED`` that the relay's one-sender rule needs)."""
    if outbox is None:
        return connections[using].vendor == "postgresql"
    return outbox


def enqueue_on_commit(
    queue: str,
    messages: Iterable[MessageItem],
    *,
    client: Client | None = None,
    using: str = "default",
    outbox: bool | None = None,
) -> str:
    """Send ``messages`` (at most 1,000: one enqueue call) to ``queue`` once the transaction of
    ``using`` commits; nothing if it rolls back. Returns the key of this enqueue (the outbox
    row's ID, also the messages' ``dedup_id`` where they have none). ``outbox``: see
    :func:`outbox_used`. ``client``: an ``mq_client.Client``; by default one from
    ``QUEUE_API_URL`` and ``QUEUE_API_TOKEN``, the service a worker's handlers consume from."""
    sender = client or default_client()
    key = uuid.uuid4().hex
    items = [message_json(m) for m in messages]
    if not items:
        raise ValueError("enqueue_on_commit needs at least one message")
    for i, item in enumerate(items):
        item.setdefault("dedup_id", key if len(items) == 1 else f"{key}-{i}")
    if outbox_used(using, outbox):
        OutboxMessage.objects.using(using).create(id=key, queue=queue, messages=items, created_at=timezone.now())
        # robust: the transaction committed and the row is there; a failed send is the relay's
        transaction.on_commit(lambda: send_row(sender, key, using=using), using=using, robust=True)
    else:
        transaction.on_commit(lambda: sender.enqueue_batch(queue, items), using=using)
    return key


def send_row(client: Any, key: str, *, using: str = "default") -> bool:
    """Send the outbox row ``key`` and delete it; False when it is gone or a relay holds it.
    A failed send is noted on the row and raised."""
    with transaction.atomic(using=using):
        row = OutboxMessage.objects.using(using).select_for_update(skip_locked=True).filter(pk=key).first()
        if row is None:
            return False
        try:
            client.enqueue_batch(row.queue, row.messages)
        except Exception as exc:  # noqa: BLE001 - noted below, then raised
            error = exc
        else:
            row.delete()
            return True
    # after the row's transaction, so that the note is not rolled back with it
    OutboxMessage.objects.using(using).filter(pk=key).update(failures=F("failures") + 1, last_error=str(error)[:2000])
    raise error


def relay(client: Any, *, using: str = "default", older_than: float = RELAY_AFTER, limit: int = 100) -> int:
    """Send the outbox rows older than ``older_than`` seconds (their writer died, or its send
    failed), the least refused first and then the oldest, each in its own transaction; how many
    were sent. A row the service refuses (its queue missing, a message over the queue's limits)
    stays, its error noted, and is tried again at the next relay, behind the rows refused fewer
    times: rows refused for good never hold up the others."""
    cutoff = timezone.now() - timedelta(seconds=older_than)
    keys = list(
        OutboxMessage.objects.using(using)
        .filter(created_at__lt=cutoff)
        .order_by("failures", "created_at")
        .values_list("pk", flat=True)[:limit]
    )
    sent = 0
    for key in keys:
        try:
            sent += send_row(client, key, using=using)
        except ApiError as exc:
            if exc.status in (0, 429) or exc.status >= 500:  # no node now, or too many calls: later
                log.warning("outbox relay: no node took %s now, the next relay tries again: %s", key, exc)
                break
            log.error("outbox %s: the service refused it, kept for the next relay: %s", key, exc)
        except DatabaseError as exc:
            log.warning("outbox relay: %s", exc)
            break
    if sent:
        log.info("outbox relay sent %d enqueue(s) left after their commit", sent)
    return sent
