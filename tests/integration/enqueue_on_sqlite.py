"""A process of an application whose database is SQLite: a transaction that rolls back sends
nothing, one that commits sends its enqueues after the commit (``transaction.on_commit``: SQLite
has no outbox).

Run as ``python -m tests.integration.enqueue_on_sqlite`` with ``DATABASE_URL`` naming an SQLite
file and the test's node in its environment (``QUEUE_API_URL``, ``QUEUE_API_TOKEN``). It migrates
that file, then, for the SDK's ``enqueue_on_commit`` (to ``plain``) and Django's example task (to
``default``), rolls one transaction back and commits another, and prints the committed task's
result ID.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from tests.integration.tasks_for_tests import email_users  # noqa: E402
from workers.outbox import enqueue_on_commit, outbox_used  # noqa: E402


class RollBack(Exception):
    pass


def main() -> None:
    assert connection.vendor == "sqlite", connection.vendor
    assert not outbox_used()  # on_commit alone: the outbox is PostgreSQL's
    call_command("migrate", verbosity=0)
    try:
        with transaction.atomic():
            enqueue_on_commit("plain", ["dropped on sqlite"])
            email_users.enqueue(["a@example.com"], "dropped on sqlite", "m")
            raise RollBack
    except RollBack:
        pass
    with transaction.atomic():
        enqueue_on_commit("plain", ["kept on sqlite"])
        result = email_users.enqueue(["a@example.com"], "kept on sqlite", "m")
    print(result.id, flush=True)


if __name__ == "__main__":
    main()
