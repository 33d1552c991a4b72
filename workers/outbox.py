"""Enqueue on commit: messages sent only if the caller's database transaction commits.

:func:`enqueue_on_commit` takes the SDK's messages (``mq_client``; the SDK itself imports no
Django) and sends them after the transaction of ``using`` commits, never when it rolls back.
Outside a transaction (autocommit) they are sent at once, as ``transaction.on_commit`` does.

How, by the application's database:

- **PostgreSQL** (the transactional outbox): an :class:`~workers.models.OutboxMessage` row is
  written in the caller's transaction; after the commit the same process sends it and deletes
  the row. A process that dies between its commit and the send leaves the row, and a relay
  (:func:`relay`, run by ``manage.py mq_tasks_worker``) sends it once it is ``relay_after``
  seconds old. A sender (the writer or a relay) first claims the row for :data:`CLAIM_FOR`
  seconds, in one statement committed at once, then sends it with no transaction open and no
  row lock held, then deletes it: a slow send (the client's retries) holds no database
  resource, and a second sender skips a claimed row. Each message carries a ``dedup_id`` (the
  row's, unless the caller gave one), so a send whose answer was lost, or whose claim ran out
  while it was under way, and that is sent again by the relay within the queue's dedup window
  is stored once.
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
from django.db.models import F, Q
from django.utils import timezone

from mq_client import ApiError, Client, tracing
from mq_client.types import MessageItem, message_json
from workers.models import OutboxMessage

log = logging.getLogger(__name__)

#: Seconds an outbox row waits for the process that wrote it before a relay sends it.
RELAY_AFTER = 10.0
#: Seconds a sender's claim on a row lasts: longer than a send with all the client's retries
#: (5 tries of 10 s and their backoffs by default), shorter than a queue's dedup window (300 s
#: by default), so that a row whose sender died mid-send is sent again, and stored once.
CLAIM_FOR = 120.0


_default_client: Client | None = None


def default_client() -> Client:
    """The process's client of the service from ``QUEUE_API_URL`` and ``QUEUE_API_TOKEN``."""
    global _default_client
    if _default_client is None:
        _default_client = Client.from_env()
    return _default_client


def outbox_used(using: str = "default", outbox: bool | None = None) -> bool:
    """Whether enqueues of ``using`` go through the outbox: ``outbox``, or (None) on PostgreSQL
    only, the database its guarantees are tested on."""
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
        # The writer's trace context goes into the row: a relay's send continues the writer's
        # trace, not its own (the SDK keeps a traceparent a message has).
        carried: dict[str, str] = {}
        tracing.inject(carried)
        if carried:
            items = [{**item, "attributes": tracing.with_context(item.get("attributes"), carried)} for item in items]
        OutboxMessage.objects.using(using).create(id=key, queue=queue, messages=items, created_at=timezone.now())
        # robust: the transaction committed and the row is there; a failed send is the relay's
        transaction.on_commit(lambda: send_row(sender, key, using=using), using=using, robust=True)
    else:
        transaction.on_commit(lambda: sender.enqueue_batch(queue, items), using=using)
    return key


def send_row(client: Any, key: str, *, using: str = "default") -> bool:
    """Claim the outbox row ``key``, send it and delete it; False when it is gone or another
    sender has claimed it. A failed send is noted on the row, its claim given up, and raised.

    Called outside a transaction (as ``transaction.on_commit`` callbacks and the relay are),
    the claim is committed before the send and the send runs with no transaction open: the
    client's retries hold no lock and no transaction of the application's."""
    now = timezone.now()
    until = now + timedelta(seconds=CLAIM_FOR)
    rows = OutboxMessage.objects.using(using)
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    # One UPDATE: of two senders, the second waits for the first's claim and then finds it taken.
    if not rows.filter(free, pk=key).update(claimed_until=until):
        return False
    row = rows.filter(pk=key).only("queue", "messages").first()
    if row is None:
        return False
    try:
        client.enqueue_batch(row.queue, row.messages)
    except Exception as exc:
        rows.filter(pk=key, claimed_until=until).update(
            claimed_until=None, failures=F("failures") + 1, last_error=str(exc)[:2000]
        )
        raise
    rows.filter(pk=key).delete()
    return True


def relay(client: Any, *, using: str = "default", older_than: float = RELAY_AFTER, limit: int = 100) -> int:
    """Send the outbox rows older than ``older_than`` seconds (their writer died, or its send
    failed) and not claimed by another sender, the least refused first and then the oldest, each
    claimed and sent as :func:`send_row` does; how many were sent. A row the service refuses (its queue missing, a message over the queue's limits)
    stays, its error noted, and is tried again at the next relay, behind the rows refused fewer
    times: rows refused for good never hold up the others."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=older_than)
    keys = list(
        OutboxMessage.objects.using(using)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now), created_at__lt=cutoff)
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
