"""``manage.py revoke``: take back what ``manage.py grant`` gave; the same flags.

    python manage.py revoke --action produce --user alice --pattern 'billing-*'

Idempotent (revoking what is not granted changes nothing, exit 0); an unknown user, group or
queue, or a bad pattern or action, is an error (exit 1). Each change is recorded in the audit
trail with the actor ``manage.py``. It revokes that one grant: rights the principal holds by
another grant (a group's, a pattern's, ``manage``) stay.
"""

from __future__ import annotations

from typing import Any

from queues import service
from queues.management.commands.grant import SHELL
from queues.management.commands.grant import Command as GrantCommand


class Command(GrantCommand):
    help = "Revoke an action on a queue or topic (--queue) or a name pattern (--pattern) from a user or a group."
    preposition = "from"

    def apply(self, found: dict[str, Any]) -> bool:
        return service.revoke(caller=SHELL, **found)

    def report(self, changed: bool, what: str) -> str:
        return f"revoked {what}" if changed else f"not granted, nothing to revoke: {what}"
