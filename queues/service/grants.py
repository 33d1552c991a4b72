"""Grants: giving and taking back an action on a queue (or topic), or on every queue whose name
matches a pattern, to a user or a Django group (the rules are in ``queues.access``).

The admin and ``manage.py grant`` / ``manage.py revoke`` call these; each change is recorded in
the audit trail (``grant`` / ``revoke``, with the principal and the action). Both calls are
idempotent: granting what is granted, or revoking what is not, changes and records nothing.
"""

from __future__ import annotations

from typing import Any

from queues import access
from queues.access import Caller, audit
from queues.models import GRANT_PATTERN_RE, Grant, Queue
from queues.service.errors import InvalidRequest


def principal_label(user: Any = None, group: Any = None) -> str:
    """``user:alice`` or ``group:ops``: how the audit trail names who a grant is for."""
    return f"user:{user.get_username()}" if user is not None else f"group:{group.name}"


def target_label(queue: Queue | None, pattern: str) -> str:
    """The queue's name, or the pattern: what a grant is on."""
    return queue.name if queue is not None else pattern


def check_grant(
    *, caller: Caller, action: str, user: Any = None, group: Any = None, queue: Queue | None = None, pattern: str = ""
) -> None:
    """Raise unless the grant is well formed and ``caller`` may make (or revoke) it: one user
    or one group, one queue or one pattern, a known action; on a queue the caller needs
    ``manage`` on it, a pattern (which covers queues made later) needs a superuser or the
    service itself. Raises InvalidRequest, access.Forbidden, QueueNotFound."""
    if (user is None) == (group is None):
        raise InvalidRequest("a grant is for one user or one group", "grant_principal")
    if (queue is None) == (not pattern):
        raise InvalidRequest("a grant is on one queue or on one name pattern", "grant_target")
    if pattern and not GRANT_PATTERN_RE.fullmatch(pattern):
        raise InvalidRequest(
            f"bad pattern {pattern!r}: a queue name (letters, digits, '_', '-', at most 80) with * for any run "
            "of name characters",
            "grant_pattern",
        )
    if action not in access.ACTIONS:
        raise InvalidRequest(f"unknown action {action!r}: one of {', '.join(access.ACTIONS)}", "grant_action")
    if queue is not None:
        access.require(caller, "manage", queue.pk, queue.name, queue.created_by_id)
    elif not caller.unrestricted:
        raise access.Forbidden(caller, "manage", pattern)


def grant(
    *, caller: Caller, action: str, user: Any = None, group: Any = None, queue: Queue | None = None, pattern: str = ""
) -> tuple[Grant, bool]:
    """Give ``action`` on ``queue`` (or on every queue matching ``pattern``) to ``user`` or
    ``group``: ``(the grant, whether it is new)``; a new one is recorded as ``grant``. Raises
    what :func:`check_grant` raises."""
    check_grant(caller=caller, action=action, user=user, group=group, queue=queue, pattern=pattern)
    row, created = Grant.objects.get_or_create(
        user=user,
        group=group,
        queue=queue,
        pattern=pattern,
        action=action,
        defaults={"created_by_id": caller.user_id},
    )
    if created:
        audit.record(
            caller, "grant", target_label(queue, pattern), principal=principal_label(user, group), action=action
        )
    return row, created


def revoke(
    *, caller: Caller, action: str, user: Any = None, group: Any = None, queue: Queue | None = None, pattern: str = ""
) -> bool:
    """Take back what :func:`grant` gave (the same arguments): whether there was such a grant;
    a removed one is recorded as ``revoke``. Raises what :func:`check_grant` raises."""
    check_grant(caller=caller, action=action, user=user, group=group, queue=queue, pattern=pattern)
    removed, _ = Grant.objects.filter(user=user, group=group, queue=queue, pattern=pattern, action=action).delete()
    if removed:
        audit.record(
            caller, "revoke", target_label(queue, pattern), principal=principal_label(user, group), action=action
        )
    return bool(removed)
