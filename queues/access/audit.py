"""The audit trail: management actions recorded with who, what and when (``AuditEntry``).

Service functions record their own management actions (create, change, delete, purge, redrive,
release, subscriptions, grants, replay) after they succeed, so every entrance is recorded the
same way; the admin shows the trail read-only.
"""

from __future__ import annotations

from typing import Any

from queues.access import Caller
from queues.models import AuditEntry


def record(caller: Caller, action: str, target: str, /, **detail: Any) -> AuditEntry:
    """Write one entry: ``caller`` did ``action`` to ``target`` (a queue, topic or
    ``topic/subscription``); ``detail`` is JSON (counts, changed fields...), and may have keys
    named like the parameters (a grant's ``action``): they are positional only."""
    return AuditEntry.objects.create(actor=caller.username, action=action, target=target, detail=detail)
