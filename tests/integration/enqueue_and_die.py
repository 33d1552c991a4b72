"""A process that commits an enqueue and is killed before the enqueue's call returns.

Run as ``python -m tests.integration.enqueue_and_die KIND QUEUE`` with the test's database and
node in its environment; KIND is ``sdk`` (``workers.outbox.enqueue_on_commit``) or ``task``
(``email_users.enqueue``). A commit hook registered before the enqueue kills the process with
SIGKILL after the commit and before the enqueue's own hook sends anything; it prints the
enqueue's key first.
"""

import os
import signal
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.db import transaction  # noqa: E402

from mq_client import Client  # noqa: E402
from workers.outbox import enqueue_on_commit  # noqa: E402


def main(kind: str, queue: str) -> None:
    with transaction.atomic():
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
        if kind == "sdk":
            key = enqueue_on_commit(Client.from_env(), queue, ["left at the commit"])
        else:
            from tests.integration.tasks_for_tests import email_users

            key = email_users.using(queue_name=queue).enqueue(["a@example.com"], "s", "m").id
        print(key, flush=True)
    raise SystemExit("the commit hook did not kill the process")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
