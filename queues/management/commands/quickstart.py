"""``manage.py quickstart``: the two identities of ``make run`` (``scripts/run.sh``), idempotent.

- ``admin``, a superuser, for the console only: its password is ``$ADMIN_PASSWORD`` (set or
  reset each time), else a random one printed once at creation. It gets no API token, and one
  an earlier ``make run`` gave it is deleted: an application holding it would have every right
  on every queue and the console's besides.
- ``app`` (``--app-user``), an ordinary user (not staff, no password: it cannot log in to the
  console) whose token is *the* API token, with ``produce`` and ``consume`` on every queue
  (``--pattern``, default ``*``). On one machine that is what applications and workers need to
  use the queues an operator makes in the console; it may create queues of its own (and manages
  those), but may not change, purge or delete anyone else's, nor grant. A deployment gives each
  application its own user and grants on its own names instead (docs/how-to/access-control.md).

Prints, one per line, for the script to read: ``MQ_ADMIN created <password>|created given|reset
given|exists -``, ``MQ_ADMIN_TOKEN revoked`` when it deleted one, ``MQ_APP <username>``,
``MQ_APP_TOKEN <key>``.
"""

from __future__ import annotations

import os
import secrets
from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from rest_framework.authtoken.models import Token

from queues import service
from queues.access import Caller


class Command(BaseCommand):
    help = "Create (or update) make run's console superuser and its applications' API user and token."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--admin-user", default="admin", help="the console's superuser (default: admin)")
        parser.add_argument("--app-user", default="app", help="the applications' user (default: app)")
        parser.add_argument("--pattern", default="*", help="the queue names it may produce to and consume from")

    @transaction.atomic
    def handle(self, *args: Any, admin_user: str, app_user: str, pattern: str, **options: Any) -> None:
        users = get_user_model()
        given = os.environ.get("ADMIN_PASSWORD") or ""
        admin = users.objects.filter(username=admin_user).first()
        if admin is None:
            password = given or secrets.token_urlsafe(12)
            admin = users.objects.create_superuser(
                username=admin_user, email=f"{admin_user}@localhost", password=password
            )
            self.stdout.write(f"MQ_ADMIN created {'given' if given else password}")
        elif given:
            admin.set_password(given)
            admin.is_staff = admin.is_superuser = admin.is_active = True
            admin.save()
            self.stdout.write("MQ_ADMIN reset given")
        else:
            self.stdout.write("MQ_ADMIN exists -")
        as_admin = Caller.of(admin)  # the audit trail says the console's superuser did it
        if service.revoke_token(admin, caller=as_admin):
            self.stdout.write("MQ_ADMIN_TOKEN revoked")

        app, created = users.objects.get_or_create(username=app_user)
        if created:
            app.set_unusable_password()
            app.save()
        elif app.is_staff or app.is_superuser:
            raise CommandError(f"user {app_user!r} is staff or a superuser: its token would not be an ordinary one")
        for action in ("produce", "consume"):
            service.grant(caller=as_admin, action=action, user=app, pattern=pattern)
        token = Token.objects.filter(user=app).first() or service.issue_token(app, caller=as_admin)
        self.stdout.write(f"MQ_APP {app.get_username()}")
        self.stdout.write(f"MQ_APP_TOKEN {token.key}")
