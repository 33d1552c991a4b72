"""``python manage.py mq_demo``: traffic for the console, so that a new operator sees it filled.

Against a running node (``make run``; ``--url``, default ``http://127.0.0.1:8000``), with an API
token (``--token``, else ``QUEUE_API_TOKEN``, else the token of ``make run``'s ``app`` user), it
makes a few queues and a topic (``demo-`` names, kept if they exist), then for ``--seconds``:

- a producer enqueues orders (in groups, with sizes), e-mails, and publishes events;
- a worker (the same pipeline as the Celery worker's, with handlers defined here) processes the
  orders and e-mails and the topic's ``billing`` subscription; about one order in twelve fails,
  so retries and dead letters show. The ``audit`` subscription is left unread: its backlog grows.

Everything goes through the REST API as an application's would, so the console shows rates,
attempts, dead letters and partition owners. Then it runs ``refresh_dashboards`` (its Spark
output goes to ``--log``, default ``$MQ_DATA_DIR/demo-dashboards.log``) so the dashboards have figures.
It shows one progress line and ends with the console's addresses.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from mq_client.transport import API_PREFIX

QUEUES = {
    "demo-orders": {
        "partitions": 4,
        "dead_letter_queue": "demo-orders-dead",
        "max_receives": 3,
        "visibility_timeout": 10,
    },
    "demo-emails": {"partitions": 2, "visibility_timeout": 10},
}
DEAD = "demo-orders-dead"
TOPIC, SUBSCRIPTIONS = "demo-events", ("billing", "audit")


class Command(BaseCommand):
    help = "Fill a running node with demonstration queues, a topic and traffic, then compute the dashboards."

    def add_arguments(self, parser):
        parser.add_argument("--url", default=os.environ.get("QUEUE_API_URL", "http://127.0.0.1:8000"))
        parser.add_argument("--token", default=os.environ.get("QUEUE_API_TOKEN", ""))
        parser.add_argument("--seconds", type=float, default=45.0, help="how long the traffic runs (default 45)")
        parser.add_argument("--rate", type=float, default=40.0, help="messages a second the producer sends (40)")
        parser.add_argument("--no-dashboards", action="store_true", help="do not run refresh_dashboards after")
        parser.add_argument("--log", default=str(Path(settings.DATA_DIR) / "demo-dashboards.log"))

    def handle(self, *args: Any, **o: Any) -> None:
        from mq_client import Client
        from workers.handlers import Handler
        from workers.pipeline import Pipeline

        token = o["token"] or self._app_token()
        url = o["url"].rstrip("/")
        client = Client(url, token, retries=2)
        try:
            client.health()
        except Exception as exc:  # noqa: BLE001 - said to the user, who starts the node
            raise CommandError(f"no node answers at {url} ({exc}): start one with `make run`") from None
        self._setup(client, url, token)

        rng = random.Random(35)  # noqa: S311 - which orders fail, not a secret
        counts = {"sent": 0, "processed": 0, "failed": 0}
        lock = threading.Lock()

        def count(key: str) -> None:
            with lock:
                counts[key] += 1

        def order(message: Any, prepared: Any) -> None:
            time.sleep(0.01 + (message.size or 1) * 0.002)
            if rng.random() < 1 / 12:
                count("failed")
                raise ValueError("the order's total does not match its lines")
            count("processed")

        def fetch(message: Any) -> None:
            time.sleep(0.005)

        def simple(message: Any, prepared: Any) -> None:
            time.sleep(0.005)
            count("processed")

        handlers = {
            "demo-orders": Handler("demo-orders", order, fetch),
            "demo-emails": Handler("demo-emails", simple),
            f"{TOPIC}/billing": Handler(f"{TOPIC}/billing", simple),
        }
        worker = Pipeline(Client(url, token, retries=2), handlers, concurrency=4, wait=1.0, name="demo-worker").start()
        stop = threading.Event()

        def produce() -> None:
            n = 0
            every = 1.0 / max(0.1, o["rate"])
            while not stop.is_set():
                started = time.monotonic()
                try:
                    if n % 4 == 3:
                        client.enqueue("demo-emails", json.dumps({"to": f"user{n}@example.com"}))
                    elif n % 4 == 2:
                        _post(url, token, f"topics/{TOPIC}/publish", {"messages": [{"body": f"event {n}"}]})
                    else:
                        client.enqueue("demo-orders", f"order {n}", group=f"customer-{n % 16}", size=rng.randint(1, 40))
                    count("sent")
                except Exception:  # noqa: BLE001, S110 - a busy node: the next one is tried
                    pass
                n += 1
                stop.wait(max(0.0, every - (time.monotonic() - started)))

        producer = threading.Thread(target=produce, name="demo-producer", daemon=True)
        producer.start()
        began = time.monotonic()
        try:
            while (elapsed := time.monotonic() - began) < o["seconds"]:
                self._bar(elapsed, o["seconds"], counts)
                time.sleep(0.5)
            self._bar(o["seconds"], o["seconds"], counts)
        finally:
            stop.set()
            producer.join(5)
            worker.stop(timeout=15)
            self.stdout.write("")
        if not o["no_dashboards"]:
            log = Path(o["log"])
            log.parent.mkdir(parents=True, exist_ok=True)
            self.stdout.write(f"computing the dashboards (Spark's output: {log})...")
            with log.open("ab") as out:
                done = subprocess.run(  # noqa: S603 - this interpreter, this project's manage.py
                    [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "refresh_dashboards"],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            if done.returncode:
                self.stderr.write(f"refresh_dashboards failed (exit {done.returncode}): see {log}")
        self.stdout.write(
            f"done: {counts['sent']} sent, {counts['processed']} processed, {counts['failed']} failed attempts.\n"
            f"  overview:   {url}/admin/overview/\n  dashboards: {url}/admin/dashboards/?queue=demo-orders"
        )

    def _bar(self, elapsed: float, total: float, counts: dict[str, int]) -> None:
        width = 30
        done = int(width * min(1.0, elapsed / total)) if total else width
        self.stdout.write(
            f"\r[{'#' * done}{'.' * (width - done)}] {elapsed:4.0f}/{total:.0f} s  "
            f"sent {counts['sent']}  processed {counts['processed']}  failed {counts['failed']}",
            ending="",
        )
        self.stdout.flush()

    def _app_token(self) -> str:
        from rest_framework.authtoken.models import Token

        key = Token.objects.filter(user__username="app").values_list("key", flat=True).first()
        if not key:
            raise CommandError("no API token: pass --token, set QUEUE_API_TOKEN, or start the node with `make run`")
        return key

    def _setup(self, client: Any, url: str, token: str) -> None:
        """The demo's queues, topic and subscriptions; those that exist are kept as they are."""
        from mq_client import errors

        for name, fields in [(DEAD, {"partitions": 1}), *QUEUES.items()]:
            try:
                client.create_queue(name, **fields)
            except errors.Conflict:
                pass
        _post(url, token, "topics", {"name": TOPIC, "partitions": 2}, ok=(201, 409))
        for sub in SUBSCRIPTIONS:
            _post(url, token, f"topics/{TOPIC}/subscriptions", {"name": sub}, ok=(201, 409))


def _post(url: str, token: str, path: str, body: dict[str, Any], ok: tuple[int, ...] = (200, 201)) -> int:
    """A call the SDK has no method for (topics), with the same token."""
    request = urllib.request.Request(  # noqa: S310 - the node's own http(s) URL
        f"{url}{API_PREFIX}/{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    if status not in ok:
        raise CommandError(f"POST {path}: {status}")
    return int(status)
