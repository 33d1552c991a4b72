"""The SQS app's own writes, with the service layer's contract: access keys and a queue's SQS
settings (``models.QueueSettings``).

They live here because their models do (``queues.service`` never imports an app above it);
each takes a ``caller`` and checks it with the core's rules before it changes anything, and is
recorded in the audit trail, whichever entrance calls it (the SQS API, the console,
``manage.py sqs_keys``). Refusals are the core's exceptions: ``access.Forbidden`` (and
``service.CredentialForbidden``), ``service.QueueNotFound``, ``service.InvalidRequest``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypedDict, Unpack

from django.db import transaction

from queues import service
from queues.access import Caller, audit, require
from queues.public import QueueRow
from sqs.attributes import MAX_RECEIVE_WAIT, MAX_TAG_KEY, MAX_TAG_VALUE, MAX_TAGS, OPAQUE
from sqs.models import AccessKey, QueueSettings

#: the settings :func:`update_queue_settings` changes (a queue's other SQS attributes are the
#: queue's own fields: ``service.update_queue``).
SETTINGS = ("receive_wait", "content_based_dedup", "tags", "opaque")


class SQSSettingsFields(TypedDict, total=False):
    """A queue's SQS settings (:data:`SETTINGS`) as :func:`update_queue_settings` takes them; a
    setting left out keeps its value."""

    #: ReceiveMessageWaitTimeSeconds: seconds a ReceiveMessage that names none waits (0 to 20).
    receive_wait: int
    #: ContentBasedDeduplication (FIFO queues only): the body's SHA-256 is the dedup ID.
    content_based_dedup: bool
    #: TagQueue's tags (at most 50), merged into the queue's unless ``replace`` names them.
    tags: dict[str, str]
    #: attributes kept as given (``sqs.attributes.OPAQUE``), merged likewise; one given as
    #: ``""`` is removed.
    opaque: dict[str, str]


# --- access keys --------------------------------------------------------------------------------
def issue_access_key(user: Any, description: str = "", *, caller: Caller) -> AccessKey:
    """A new active key pair for ``user`` (``service.check_issuer``: oneself; a superuser for
    another user who is not a superuser). The returned key's ``secret`` is shown by the caller
    once. Recorded as ``issue_key``. Raises CredentialForbidden, InvalidRequest (a description
    over 200 characters)."""
    service.check_issuer(caller, user, "issue an access key")
    if len(description) > 200:
        raise service.InvalidRequest("a key's description is at most 200 characters", "out_of_range")
    with transaction.atomic():
        key = AccessKey.issue(user, description)
        audit.record(caller, "issue_key", f"user:{user.get_username()}", access_key_id=key.access_key_id)
    return key


def describe_access_key(key: AccessKey, description: str, *, caller: Caller) -> AccessKey:
    """Change a key's description (its holder, or a superuser). Raises CredentialForbidden,
    InvalidRequest."""
    service.check_revoker(caller, key.user, "change an access key")
    if len(description) > 200:
        raise service.InvalidRequest("a key's description is at most 200 characters", "out_of_range")
    AccessKey.objects.filter(pk=key.pk).update(description=description)
    key.description = description
    return key


def revoke_access_key(key: AccessKey, *, caller: Caller) -> bool:
    """Revoke a key (its holder, or a superuser): whether it was active. Its save announces the
    change to every process (``sqs.keys``), so it is refused from the next call on, on every
    node. Recorded as ``revoke_key``. Raises CredentialForbidden, ``Unavailable`` (the
    key-value store, where the change is announced: the key is then not revoked)."""
    service.check_revoker(caller, key.user, "revoke an access key")
    with transaction.atomic():
        if not AccessKey.objects.filter(pk=key.pk, revoked_at__isnull=True).exists():
            return False
        key.revoke()
        audit.record(caller, "revoke_key", f"user:{key.user.get_username()}", access_key_id=key.access_key_id)
    return True


# --- a queue's SQS settings ---------------------------------------------------------------------
def update_queue_settings(
    q: QueueRow,
    *,
    caller: Caller,
    replace: Iterable[str] = (),
    remove_tags: Iterable[str] = (),
    **fields: Unpack[SQSSettingsFields],
) -> QueueSettings:
    """Change the SQS settings of queue ``q`` (:data:`SETTINGS`), under its row's lock:
    ``manage`` on the queue, as SetQueueAttributes. ``opaque`` and ``tags`` are merged into what
    is kept unless ``replace`` names them (an ``opaque`` attribute given as ``""`` is removed); ``remove_tags`` are dropped (UntagQueue). Checked as
    the SQS API checks them: a wait of 0 to 20 s, ContentBasedDeduplication on a FIFO queue
    only, the attributes kept as given (:data:`OPAQUE`) by name, at most 50 tags. The SQS API
    reads them at every call, on every node. Recorded as ``change`` of the queue, what changed
    under ``sqs``. Raises QueueNotFound / ``access.Forbidden``, InvalidRequest."""
    check_queue_settings(q, caller=caller, **fields)
    replace, remove_tags = set(replace), set(remove_tags)
    with transaction.atomic():
        s, _ = QueueSettings.objects.select_for_update().get_or_create(queue_id=q.pk)
        if "receive_wait" in fields:
            s.receive_wait = fields["receive_wait"]
        if "content_based_dedup" in fields:
            s.content_based_dedup = fields["content_based_dedup"]
        if "tags" in fields:
            s.tags = fields["tags"] if "tags" in replace else {**(s.tags or {}), **fields["tags"]}
        if "opaque" in fields:
            opaque = fields["opaque"] if "opaque" in replace else {**(s.opaque or {}), **fields["opaque"]}
            # an attribute set to "" is removed (SQS: ``Policy`` "" clears it)
            s.opaque = {name: value for name, value in opaque.items() if value != ""}
        if remove_tags:
            s.tags = {k: v for k, v in (s.tags or {}).items() if k not in remove_tags}
        if len(s.tags or {}) > MAX_TAGS:
            raise service.InvalidRequest(f"a queue has at most {MAX_TAGS} tags", "too_many_tags")
        s.save()
        detail: dict[str, Any] = dict(fields)
        if remove_tags:
            detail["removed_tags"] = sorted(remove_tags)
        audit.record(caller, "change", q.name, sqs=detail)
    return s


def check_queue_settings(q: QueueRow, *, caller: Caller, **fields: Unpack[SQSSettingsFields]) -> None:
    """Raise what :func:`update_queue_settings` would refuse, changing nothing (a form's check)."""
    require(caller, "manage", q.pk, q.name, q.created_by_id)
    unknown = sorted(set(fields) - set(SETTINGS))
    if unknown:
        raise service.InvalidRequest(f"unknown SQS settings: {', '.join(unknown)}", "unknown_setting")

    def bad(detail: str) -> service.InvalidRequest:
        return service.InvalidRequest(f"{q.name}: {detail}", "invalid_setting")

    wait = fields.get("receive_wait")
    if wait is not None and (not isinstance(wait, int) or isinstance(wait, bool) or not 0 <= wait <= MAX_RECEIVE_WAIT):
        raise bad(f"receive_wait is 0 to {MAX_RECEIVE_WAIT} seconds")
    dedup = fields.get("content_based_dedup")
    if dedup is not None and not isinstance(dedup, bool):
        raise bad("content_based_dedup is true or false")
    if dedup and not q.strict:
        raise bad("ContentBasedDeduplication is for FIFO queues only")
    for name in ("tags", "opaque"):
        value = fields.get(name)
        if value is not None and (
            not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            raise bad(f"{name} maps names to strings")
    tags = fields.get("tags") or {}
    if any(not 1 <= len(k) <= MAX_TAG_KEY or len(v) > MAX_TAG_VALUE for k, v in tags.items()):
        raise bad(f"tag keys are 1 to {MAX_TAG_KEY} characters, values at most {MAX_TAG_VALUE}")
    opaque = fields.get("opaque") or {}
    unknown = sorted(set(opaque) - OPAQUE)
    if unknown:
        raise bad(f"not an SQS attribute kept as given: {', '.join(unknown)}")
