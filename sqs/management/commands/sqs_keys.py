"""``manage.py sqs_keys create <user> [--description D]`` | ``list [<user>]`` | ``revoke <key id or user>``."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from queues.access import SYSTEM
from sqs import service
from sqs.keys import changes_in_force_at_exit
from sqs.models import AccessKey

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class Command(BaseCommand):
    help = "Create, list and revoke the SQS API's access keys (SigV4) of the service's users."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="command", required=True)
        create = sub.add_parser("create", help="a new key pair for a user (the secret is printed once)")
        create.add_argument("user")
        create.add_argument("--description", default="")
        listing = sub.add_parser("list", help="keys with their last use")
        listing.add_argument("user", nargs="?")
        revoke = sub.add_parser("revoke", help="revoke one key by its ID, or every key of a user")
        revoke.add_argument("key_or_user")

    def handle(self, *args: Any, **opts: Any) -> None:
        run: Callable[[dict[str, Any]], None] = getattr(self, f"_{opts['command']}")
        return run(opts)

    def _user(self, name: str) -> User:
        user = get_user_model().objects.filter(username=name).first()
        if user is None:
            raise CommandError(f"no user {name!r}")
        return user

    def _create(self, opts: dict[str, Any]) -> None:
        # as the service itself: whoever runs manage.py on the host may act for any user
        key = service.issue_access_key(self._user(opts["user"]), opts["description"], caller=SYSTEM)
        self.stdout.write(f"aws_access_key_id = {key.access_key_id}\naws_secret_access_key = {key.secret}")

    def _list(self, opts: dict[str, Any]) -> None:
        rows = AccessKey.objects.select_related("user")
        if opts["user"]:
            rows = rows.filter(user=self._user(opts["user"]))
        for k in rows:
            used = k.last_used_at.isoformat(timespec="seconds") if k.last_used_at else "never"
            state = "active" if k.revoked_at is None else f"revoked {k.revoked_at.isoformat(timespec='seconds')}"
            self.stdout.write(
                f"{k.access_key_id}  {k.user}  created {k.created_at:%Y-%m-%d %H:%M}  used {used}  {state}"
            )

    def _revoke(self, opts: dict[str, Any]) -> None:
        target = opts["key_or_user"]
        keys = list(AccessKey.objects.filter(access_key_id=target, revoked_at__isnull=True).select_related("user"))
        if not keys:
            user = get_user_model().objects.filter(username=target).first()
            if user is None and not AccessKey.objects.filter(access_key_id=target).exists():
                raise CommandError(f"no key or user {target!r}")
            keys = (
                list(AccessKey.objects.filter(user=user, revoked_at__isnull=True).select_related("user"))
                if user
                else []
            )
        with changes_in_force_at_exit():  # (one wait for the processes' leases, not one a key)
            for k in keys:
                service.revoke_access_key(k, caller=SYSTEM)
        # (said once in force: every process of the cluster refuses them from its next call)
        for k in keys:
            self.stdout.write(f"revoked {k.access_key_id} of {k.user}")
        if not keys:
            self.stdout.write("nothing to revoke")
