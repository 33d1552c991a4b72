"""``ReceiveRequestAttemptId`` on FIFO queues: a receive retried with the same attempt ID within
five minutes answers the same messages and receipt handles, as long as they are in flight.

SQS (API reference, ReceiveMessage): "During a visibility timeout, subsequent calls with the
same ReceiveRequestAttemptId return the same messages and receipt handles. If a retry occurs
within the deduplication interval, it resets the visibility timeout." The ID is at most 128
characters, alphanumerics and punctuation; it applies only to FIFO queues.

An answer is kept as a row (:class:`sqs.models.ReceiveAttempt`) of the user, queue and ID, so
a retry that lands on another process or node of the cluster finds it. A retry sets each kept
message's visibility timeout again through its receipt, which the message's owner checks: a
message deleted, visible again or received again since is left out; when none is left, the
retry is a new receive, kept under the ID in its turn. A message's receipt outlives its
owner's failover as far as the new owner keeps it (``docs/reference/sqs.md``).
"""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from typing import Any

from django.db import IntegrityError
from django.utils import timezone

from queues import service
from queues.service.types import QueueConfig
from sqs import ids
from sqs.context import Context, invalid, service_errors, text_param
from sqs.models import ReceiveAttempt

log = logging.getLogger(__name__)

#: SQS: "ReceiveRequestAttemptId can contain alphanumeric characters (a-z, A-Z, 0-9) and
#: punctuation (!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~)", at most 128 of them.
_ATTEMPT_ID = re.compile(r"[A-Za-z0-9!-/:-@\[-`{-~]{1,128}")


def attempt_param(params: dict[str, Any]) -> str | None:
    """The call's ``ReceiveRequestAttemptId``, checked (None: none given). Raises
    InvalidParameterValue for one of more than 128 characters or of others than SQS allows."""
    attempt = text_param(params, "ReceiveRequestAttemptId")
    if attempt is not None and not _ATTEMPT_ID.fullmatch(attempt):
        raise invalid(
            "Value for parameter ReceiveRequestAttemptId is invalid. Reason: it must be 1 to 128 characters, "
            "alphanumeric or punctuation."
        )
    return attempt


def _recent(q: QueueConfig, user_id: int, attempt: str) -> Any:
    cutoff = timezone.now() - timedelta(seconds=ReceiveAttempt.WINDOW)
    return ReceiveAttempt.objects.filter(
        queue_id=q.id, user_id=user_id, attempt_id=attempt, created_at__gte=cutoff
    ).first()


def retried(q: QueueConfig, ctx: Context, attempt: str) -> list[dict[str, Any]] | None:
    """The messages of an earlier receive of this attempt still in flight under the receipts it
    gave, their visibility timeout set again (SQS); None when there was none within the window,
    or none of its messages is in flight any more. Raises what the service's visibility change
    raises for an outage (ServiceUnavailable)."""
    user_id = ctx.caller.user_id
    row = _recent(q, user_id, attempt) if user_id is not None else None
    if row is None:
        return None
    kept = []
    for item in row.messages:
        parsed = ids.parse_receipt_handle(item.get("ReceiptHandle"), q.name)
        if parsed is None:
            continue
        mid, receipt = parsed
        with service_errors():
            try:
                service.change_visibility(q.name, mid, receipt, float(row.visibility), caller=ctx.caller)
            except service.ReceiptMismatch:
                continue  # deleted, visible again or received again since
            except service.RemoteError as exc:
                if exc.status != 409:
                    raise
                continue
        kept.append(item)
    return kept or None


def remember(q: QueueConfig, ctx: Context, attempt: str, messages: list[dict[str, Any]], visibility: int) -> None:
    """Keep a receive's answer under its attempt ID (replacing an earlier one whose messages are
    no longer in flight); rows of the queue past the window are deleted meanwhile."""
    user_id = ctx.caller.user_id
    if user_id is None:  # the service's own calls retry nothing
        return
    now = timezone.now()
    ReceiveAttempt.objects.filter(queue_id=q.id, created_at__lt=now - timedelta(seconds=ReceiveAttempt.WINDOW)).delete()
    try:
        ReceiveAttempt.objects.update_or_create(
            queue_id=q.id,
            user_id=user_id,
            attempt_id=attempt,
            defaults={"messages": messages, "visibility": visibility, "created_at": now},
        )
    except IntegrityError:
        # (update_or_create takes a concurrent insert of the same attempt itself, and this
        # answer replaces it: the later answer is kept; both calls' messages stand, at least once)
        log.info("receive attempt %r on %s: a concurrent call kept its answer", attempt, q.name)
