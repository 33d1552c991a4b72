"""A process that commits an enqueue and is killed before the enqueue's call returns.

Run as ``python -m tests.integration.enqueue_and_die`` with the test's database and node in its
environment. One transaction enqueues a message with ``workers.outbox.enqueue_on_commit`` (to
``plain``) and Django's example task (to ``default``); a commit hook registered before them
kills the process with SIGKILL after the commit and before their own hooks send anything. It
prints the message's key and the task's result ID first.
"""

import os
import signal

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

from django.db import transaction  # noqa: E402

from tests.integration.tasks_for_tests import email_users  # noqa: E402
from workers.outbox import enqueue_on_commit  # noqa: E402


def main() -> None:
    with transaction.atomic():
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
        key = enqueue_on_commit("plain", ["left at the commit"])
        result = email_users.enqueue(["a@example.com"], "left at the commit", "m")
        print(key, result.id, flush=True)
    raise SystemExit("the commit hook did not kill the process")


if __name__ == "__main__":
    main()
