"""Enqueue on commit: messages sent only if the caller's database transaction commits.

:func:`enqueue_on_commit` takes the SDK's messages (``mq_client``; the SDK itself imports no
Django) and sends them after the transaction of ``using`` commits, never when it rolls back.
Outside a transaction (autocommit) they are sent at once, as ``transaction.on_commit`` does.

How, by the application's database:

- **PostgreSQL** (the transactional outbox): an :class:`~workers.models.OutboxMessage` row is
  written in the caller's transaction, with its writer: the user of the client's API token
  (no token is stored). After the commit the same process sends it with that client and
  deletes the row. A process that dies between its commit and the send leaves the row, and a
  relay (:func:`relay`, run by ``manage.py mq_tasks_worker`` and Celery beat) sends it once it
  is ``relay_after`` seconds old, as its writer: it reads the writer and the writer's grants
  then, and has a node store the messages with a call signed for the writer, as a node
  forwards a client's call (``queues.service.on_behalf``), never with rights of its own. A row
  whose writer was deleted or deactivated, or may not ``produce`` to the queue then, is given
  up with the reason (``given_up_at``, ``given_up_reason``) and never sent.
  A sender (the writer or a relay) first claims the row for :data:`CLAIM_FOR` seconds, in one
  statement committed at once, then sends it with no transaction open and no row lock held,
  then deletes it: a slow send (the client's retries) holds no database resource, and a second
  sender skips a claimed row. Each message carries a ``dedup_id`` (the row's, unless the
  caller gave one), so a send whose answer was lost, or whose claim ran out while it was under
  way, and that is sent again by the relay within the queue's dedup window is stored once.
- **Any other database** (SQLite, MySQL...): ``transaction.on_commit`` alone. Nothing is sent
  on a rollback, but a process that dies after its commit and before the send loses the
  messages, and a send that fails after the commit raises from the commit (the transaction
  stands).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone
from rest_framework.exceptions import APIException

from mq_client import Client, tracing
from mq_client.types import MessageItem, message_json
from queues import service
from queues.access import Forbidden
from queues.errors import Refused, ServiceError
from queues.http import throttles, validation
from workers.models import OutboxMessage

log = logging.getLogger(__name__)

#: Seconds an outbox row waits for the process that wrote it before a relay sends it.
RELAY_AFTER = 10.0
#: Seconds a sender's claim on a row lasts: longer than a send with all the client's retries
#: (5 tries of 10 s and their backoffs by default), shorter than a queue's dedup window (300 s
#: by default), so that a row whose sender died mid-send is sent again, and stored once.
CLAIM_FOR = 120.0
#: The claim a given-up row keeps: no sender takes it again, a relay of an earlier version
#: (which knows nothing of ``given_up_at``) included.
GIVEN_UP_CLAIM = datetime(9999, 1, 1, tzinfo=UTC)


class WriterRefused(Refused):
    """A row may not be sent as its writer (none recorded, deleted, deactivated, or without
    ``produce`` on the queue): the relay gives it up with this reason (403)."""

    code = "writer_refused"
    status = 403


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


def writer_of(client: Any) -> int:
    """The id of the user ``client`` sends as: its API token's (``client.token``), read from
    the service's database. The writer of what a relay sends later: an outbox row, a held task
    (``workers.tasks_backend``). ValueError: a client without a token, or with one this service
    does not know (revoked, or another service's): no relay could send as its user."""
    token = getattr(client, "token", None)
    if not isinstance(token, str) or not token:
        raise ValueError(
            "an enqueue that a relay sends later (through the outbox, or a held task) needs a client "
            "with an API token: its user is the writer the relay sends as"
        )
    user_id = service.token_holder(token)
    if user_id is None:
        raise ValueError(
            "the client's API token is not one of this service's (revoked, or another service's): "
            "a relay sends as the token's user, looked up in this project's database"
        )
    return user_id


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
    ``QUEUE_API_URL`` and ``QUEUE_API_TOKEN``, the service a worker's handlers consume from.
    Through the outbox the row records the user of the client's token (:func:`writer_of`,
    ValueError), whom a relay sends it as."""
    sender = client or default_client()
    key = uuid.uuid4().hex
    items = [message_json(m) for m in messages]
    if not items:
        raise ValueError("enqueue_on_commit needs at least one message")
    for i, item in enumerate(items):
        item.setdefault("dedup_id", key if len(items) == 1 else f"{key}-{i}")
    if outbox_used(using, outbox):
        writer = writer_of(sender)
        # The writer's trace context goes into the row: a relay's send continues the writer's
        # trace, not its own (the SDK keeps a traceparent a message has).
        carried: dict[str, str] = {}
        tracing.inject(carried)
        if carried:
            items = [{**item, "attributes": tracing.with_context(item.get("attributes"), carried)} for item in items]
        OutboxMessage.objects.using(using).create(
            id=key, queue=queue, messages=items, created_at=timezone.now(), writer_id=writer
        )
        # robust: the transaction committed and the row is there; a failed send is the relay's
        transaction.on_commit(lambda: send_row(sender, key, using=using), using=using, robust=True)
    else:
        transaction.on_commit(lambda: sender.enqueue_batch(queue, items), using=using)
    return key


def _claim(rows: QuerySet[OutboxMessage], key: str) -> datetime | None:
    """Claim row ``key`` for :data:`CLAIM_FOR` seconds; until when, or None when it is gone,
    given up, or claimed by another sender. One UPDATE: of two senders, the second waits for
    the first's claim and then finds it taken."""
    now = timezone.now()
    until = now + timedelta(seconds=CLAIM_FOR)
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    if not rows.filter(free, pk=key, given_up_at__isnull=True).update(claimed_until=until):
        return None
    return until


def _failed(rows: QuerySet[OutboxMessage], key: str, until: datetime, exc: BaseException) -> None:
    """Note a failed send on row ``key`` and give its claim up (unless it ran out meanwhile)."""
    rows.filter(pk=key, claimed_until=until).update(
        claimed_until=None, failures=F("failures") + 1, last_error=str(exc)[:2000]
    )


def send_row(client: Any, key: str, *, using: str = "default") -> bool:
    """Claim the outbox row ``key``, send it with ``client`` (the writer's own, after its
    commit) and delete it; False when it is gone, given up, or claimed by another sender. A
    failed send is noted on the row, its claim given up, and raised.

    Called outside a transaction (as ``transaction.on_commit`` callbacks are), the claim is
    committed before the send and the send runs with no transaction open: the client's retries
    hold no lock and no transaction of the application's."""
    rows = OutboxMessage.objects.using(using)
    until = _claim(rows, key)
    if until is None:
        return False
    row = rows.filter(pk=key).only("queue", "messages").first()
    if row is None:
        return False
    try:
        client.enqueue_batch(row.queue, row.messages)
    except Exception as exc:
        _failed(rows, key, until, exc)
        raise
    rows.filter(pk=key).delete()
    return True


def send_as(
    writer_id: int | None, queue: str, messages: list[dict[str, Any]], *, detail: Mapping[str, Any]
) -> list[str]:
    """Send ``messages`` to ``queue`` as user ``writer_id``, through the service layer, from a
    process that holds none of the writer's credentials (``queues.service.on_behalf``): the
    writer and its grants read now, the writer's call rate counted, the messages checked as the
    REST API checks a client's, and a node asked to store them with a call signed for the
    writer, where the writer's rights are checked again. Recorded in the audit trail as
    ``relayed`` by the writer, with ``detail``. The messages' IDs. What the outbox's relay and
    the tasks backend's held tasks (``QueueTaskBackend.release_held``) are sent with.

    Raises WriterRefused (no writer recorded, the writer deleted or deactivated, or without
    ``produce`` on the queue), and what the service raises: QueueNotFound (no such queue), a
    400 (a message the queue's rules refuse), RemoteError (a node's answer), 429 (the writer's
    call rate), Unavailable (no node now)."""
    if writer_id is None:
        raise WriterRefused("no writer recorded (written by an earlier version): a relay sends only as the writer")
    try:
        writer = service.acting_user(writer_id)
        cfg = service.producer_config(queue, caller=writer)
    except (service.NoActiveUser, Forbidden) as exc:
        raise WriterRefused(str(exc)) from exc
    assert writer.user_id is not None
    throttles.check_user(writer.user_id)
    drafts, _ = validation.enqueue_request({"messages": messages}, cfg, time.time())
    # A node's refusal (401, 403) gives nothing up: its caches may be a few seconds behind the
    # rows read here, either way, and a 401 may be this process's cluster secret, not the
    # writer. The caller keeps what it sends, and its next try's check, read from the rows, decides.
    return service.enqueue_through_node(cfg, drafts, caller=writer, detail=detail)


def send_as_writer(row: OutboxMessage) -> list[str]:
    """Send ``row``'s messages as its writer (:func:`send_as`), the row's key in the audit
    trail's entry as ``outbox``. Raises what :func:`send_as` raises."""
    return send_as(row.writer_id, row.queue, row.messages, detail={"outbox": row.pk})


def status_of(exc: BaseException) -> int | None:
    """The HTTP status ``exc`` stands for, None for an error that is not an answer."""
    if isinstance(exc, ServiceError):
        return exc.status
    if isinstance(exc, APIException):
        return int(exc.status_code)
    return None


def relay(
    *,
    using: str = "default",
    older_than: float = RELAY_AFTER,
    limit: int = 100,
    send: Callable[[OutboxMessage], object] = send_as_writer,
) -> int:
    """Send the outbox rows older than ``older_than`` seconds (their writer died, or its send
    failed), not given up and not claimed by another sender, the least refused first and then
    the oldest, each claimed as :func:`send_row` claims it and sent by ``send`` (by default
    :func:`send_as_writer`: as its writer); how many were sent.

    A row that may not be sent as its writer (WriterRefused) is given up: marked with the
    reason, kept (never sent again) and logged. A row the service refuses otherwise (its queue
    missing, a message over the queue's limits) stays, its error noted, and is tried again at
    the next relay, behind the rows refused fewer times: rows refused for good never hold up
    the others. No node now, or the writer over its call rate: this relay stops, the next one
    tries again."""
    rows = OutboxMessage.objects.using(using)
    now = timezone.now()
    cutoff = now - timedelta(seconds=older_than)
    keys = list(
        rows.filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now), created_at__lt=cutoff)
        .filter(given_up_at__isnull=True)
        .order_by("failures", "created_at")
        .values_list("pk", flat=True)[:limit]
    )
    sent = 0
    for key in keys:
        try:
            until = _claim(rows, key)
            row = rows.filter(pk=key).only("queue", "messages", "writer_id").first() if until else None
        except DatabaseError as exc:
            log.warning("outbox relay: %s", exc)
            break
        if until is None or row is None:
            continue
        try:
            send(row)
        except WriterRefused as exc:
            rows.filter(pk=key, claimed_until=until).update(
                claimed_until=GIVEN_UP_CLAIM, given_up_at=timezone.now(), given_up_reason=str(exc)[:2000]
            )
            log.error("outbox %s to %s given up, not sent: %s", key, row.queue, exc)
            continue
        except DatabaseError as exc:
            log.warning("outbox relay: %s", exc)
            break
        except Exception as exc:
            _failed(rows, key, until, exc)
            status = status_of(exc)
            if status is None:
                raise
            if status == 429 or status >= 500:  # no node now, or too many calls: later
                log.warning("outbox relay: no node took %s now, the next relay tries again: %s", key, exc)
                break
            log.error("outbox %s: the service refused it, kept for the next relay: %s", key, exc)
            continue
        rows.filter(pk=key).delete()
        sent += 1
    if sent:
        log.info("outbox relay sent %d enqueue(s) left after their commit", sent)
    return sent
