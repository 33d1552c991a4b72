"""``manage.py grant``: give a user or a group an action on a queue (or topic), or on every queue
whose name matches a pattern, from the shell or a script.

    python manage.py grant --action produce --user alice --pattern 'billing-*'
    python manage.py grant --action consume --group billing-workers --queue billing-eu

Idempotent (granting what is granted changes nothing, exit 0); an unknown user, group or queue,
or a bad pattern or action, is an error (exit 1). Each change is recorded in the audit trail
with the actor ``manage.py``. ``manage.py revoke`` takes the same flags.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from queues import access, service
from queues.access import Caller
from queues.models import Queue

#: who the audit trail says made a change from the shell: whoever may run manage.py may do anything.
SHELL = Caller(None, "manage.py", system=True)


class Command(BaseCommand):
    help = "Grant an action on a queue or topic (--queue) or a name pattern (--pattern) to a user or a group."
    preposition = "to"

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--action", required=True, choices=access.ACTIONS, help="the action")
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", help="a user's username")
        who.add_argument("--group", help="a Django group's name")
        on = parser.add_mutually_exclusive_group(required=True)
        on.add_argument("--queue", help="a queue's or a topic's name")
        on.add_argument("--pattern", help="a name pattern, * for any run of name characters: 'billing-*'")

    def arguments(self, options: dict[str, Any]) -> dict[str, Any]:
        """The service's arguments for the flags; CommandError for a name that names nothing."""
        found: dict[str, Any] = {"action": options["action"], "pattern": options["pattern"] or ""}
        if options["user"] is not None:
            user_model = get_user_model()
            try:
                found["user"] = user_model.objects.get(**{user_model.USERNAME_FIELD: options["user"]})
            except user_model.DoesNotExist:
                raise CommandError(f"no user named {options['user']!r}") from None
        else:
            try:
                found["group"] = Group.objects.get(name=options["group"])
            except Group.DoesNotExist:
                raise CommandError(f"no group named {options['group']!r}") from None
        if options["queue"] is not None:
            try:
                found["queue"] = Queue.objects.get(name=options["queue"])
            except Queue.DoesNotExist:
                raise CommandError(f"no queue or topic named {options['queue']!r}") from None
        return found

    def handle(self, *args: Any, **options: Any) -> None:
        found = self.arguments(options)
        try:
            changed = self.apply(found)
        except service.InvalidRequest as exc:
            raise CommandError(exc.detail) from None
        who = f"user {options['user']}" if options["user"] is not None else f"group {options['group']}"
        on = f"queue {options['queue']}" if options["queue"] is not None else f"pattern {options['pattern']}"
        self.stdout.write(self.report(changed, f"{options['action']} on {on} {self.preposition} {who}"))

    def apply(self, found: dict[str, Any]) -> bool:
        _, created = service.grant(caller=SHELL, **found)
        return created

    def report(self, changed: bool, what: str) -> str:
        return f"granted {what}" if changed else f"already granted: {what}"
