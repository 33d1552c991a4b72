"""``python manage.py mq_demo``: traffic for the console, so that a new operator sees it filled.

Against a running node (``make run``; ``--url``, default ``http://127.0.0.1:8000``), with an API
token (``--token``, else ``QUEUE_API_TOKEN``, else the token of ``make run``'s ``app`` user), it
makes a few queues and a topic (``demo-`` names, kept if they exist), then for ``--seconds``:

- a producer enqueues orders (in groups, with sizes), e-mails, and publishes events;
- a worker (the same pipeline as the Celery worker's, with handlers defined here) processes the
  orders and e-mails and the topic's ``billing`` subscription; about one order in twelve fails,
  so retries and dead letters show. The ``audit`` subscription is left unread: its backlog grows.

Everything goes through the REST API as an application's would, so the console shows rates,
attempts, dead letters and partition owners. The traffic goes on past ``--seconds`` (up to
:data:`FIRST_ATTEMPT_WAIT` more) until the worker's first attempt is in the attempt log.

The dashboards' Spark job runs in this process (unless ``--no-dashboards``): its session starts
with the traffic (the JVM's start-up, the slowest part, overlaps it), a first refresh runs as
soon as the worker's first attempts are in the log, and a last one after the traffic (unless the
first began after it: it read all of it). Spark runs small (``--spark-master``, default
``local[1]`` where ``SPARK_MASTER`` is a local one, and one shuffle partition: a minute of
traffic is a few thousand rows); its own output goes to ``--log`` (default
``$MQ_DATA_DIR/demo-dashboards.log``). The command shows one progress line and ends with the
console's addresses and when the dashboards were filled.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from mq_client.transport import API_PREFIX

if TYPE_CHECKING:
    from mq_client import Client


class _QueueSettings(TypedDict, total=False):
    """What the demo sets of a queue's settings (``Client.create_queue``'s keywords)."""

    partitions: int
    dead_letter_queue: str
    max_receives: int
    visibility_timeout: float


QUEUES: dict[str, _QueueSettings] = {
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
#: Seconds the traffic may go on past ``--seconds`` while no attempt of the worker is in the log.
FIRST_ATTEMPT_WAIT = 30.0


class Dashboards:
    """The dashboards' Spark job in this process: the session started at once, on a thread of
    its own; a first refresh on another as soon as :meth:`refresh_soon` is called; the last one
    by :meth:`refresh_last`. ``state`` says where it is, for the progress line."""

    def __init__(self, log: Path, master: str, partitions: int, began: float) -> None:
        self.log, self.master, self.partitions = log, master, partitions
        #: the command's start (monotonic)
        self.began = began
        self.state = "starting Spark"
        #: seconds after ``began`` when a refresh first wrote the dashboards (None: not yet)
        self.filled_at: float | None = None
        self.error: str | None = None
        self._spark: Any = None
        self._ready = threading.Event()
        self._first: threading.Thread | None = None
        #: when the first refresh began reading (monotonic; None: not yet)
        self._first_began: float | None = None
        threading.Thread(target=self._start, name="demo-spark", daemon=True).start()

    def _start(self) -> None:
        from consoles.management.commands.refresh_dashboards import _stderr_to
        from consoles.spark import job

        try:
            # the JVM writes to the standard error it starts with: the log, from then on
            with _stderr_to(str(self.log)):
                self._spark = job.spark_session(self.master, self.partitions)
            self.state = "Spark ready"
            self._note(f"Spark ({self.master}) ready")
        except Exception as exc:  # noqa: BLE001 - said at the end; the traffic goes on
            self.error = f"{type(exc).__name__}: {exc}"
            self.state = "Spark failed"
        finally:
            self._ready.set()

    def _refresh(self, which: str) -> None:
        from django.db import connection

        from consoles.spark import job

        self._ready.wait()
        if self._spark is None:
            return
        if which == "first":
            self._first_began = time.monotonic()

        def progress(step: int, steps: int, text: str) -> None:
            self.state = f"{which} refresh {step}/{steps}"

        try:
            run = job.run(trigger="demo", progress=progress, spark=self._spark)
            self.filled_at = self.filled_at or time.monotonic() - self.began
            self.state = f"filled ({run.attempts_read:,} attempts)"
            self._note(f"the {which} refresh done: {run.attempts_read:,} attempts")
        except Exception as exc:  # noqa: BLE001 - said at the end
            self.error = f"{type(exc).__name__}: {exc}"
            self.state = f"{which} refresh failed"
        finally:
            connection.close()  # (this thread's)

    def _note(self, text: str) -> None:
        """A line of the demo's own in the log, with the seconds since the command started."""
        with self.log.open("a") as out:
            out.write(f"mq_demo: {time.monotonic() - self.began:.1f} s: {text}\n")

    def refresh_soon(self) -> None:
        """The first refresh, on a thread, once Spark is up (once)."""
        if self._first is None:
            self._first = threading.Thread(target=self._refresh, args=("first",), name="demo-refresh", daemon=True)
            self._first.start()

    def refresh_last(self, traffic_ended: float) -> threading.Thread:
        """After the first (if it started), a refresh of all the traffic (unless the first began
        after ``traffic_ended``, monotonic: it read all of it), then Spark stops: on a thread,
        returned (the progress line goes on meanwhile)."""

        def last() -> None:
            if self._first is not None:
                self._first.join()
            if self._first_began is None or self._first_began < traffic_ended:
                self._refresh("last")
            if self._spark is not None:
                self._spark.stop()

        thread = threading.Thread(target=last, name="demo-refresh", daemon=True)
        thread.start()
        return thread


class Command(BaseCommand):
    help = "Fill a running node with demonstration queues, a topic and traffic, then compute the dashboards."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default=os.environ.get("QUEUE_API_URL", "http://127.0.0.1:8000"))
        parser.add_argument("--token", default=os.environ.get("QUEUE_API_TOKEN", ""))
        parser.add_argument("--seconds", type=float, default=30.0, help="how long the traffic runs (default 30)")
        parser.add_argument("--rate", type=float, default=40.0, help="messages a second the producer sends (40)")
        parser.add_argument("--no-dashboards", action="store_true", help="do not compute the dashboards")
        parser.add_argument("--log", default=str(Path(settings.DATA_DIR) / "demo-dashboards.log"))
        local = settings.SPARK_MASTER.startswith("local")
        parser.add_argument(
            "--spark-master",
            default="local[1]" if local else settings.SPARK_MASTER,
            help="the dashboards job's Spark master (default: local[1], or SPARK_MASTER where it names a cluster)",
        )

    def handle(self, *args: Any, **o: Any) -> None:
        from mq_client import Client
        from workers.handlers import Handler
        from workers.models import AttemptLog
        from workers.pipeline import Pipeline

        started_at = time.monotonic()

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

        demo_queues = [*QUEUES, TOPIC, f"{TOPIC}/billing"]
        before = AttemptLog.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        dashboards = None
        if not o["no_dashboards"]:
            log = Path(o["log"])
            log.parent.mkdir(parents=True, exist_ok=True)
            dashboards = Dashboards(log, o["spark_master"], 1, started_at)
        producer = threading.Thread(target=produce, name="demo-producer", daemon=True)
        producer.start()
        began = time.monotonic()
        attempted = False
        try:
            while (elapsed := time.monotonic() - began) < o["seconds"] or (
                not attempted and elapsed < o["seconds"] + FIRST_ATTEMPT_WAIT
            ):
                if not attempted and AttemptLog.objects.filter(pk__gt=before, queue__in=demo_queues).exists():
                    attempted = True
                    if dashboards is not None:
                        dashboards.refresh_soon()
                self._bar(elapsed, o["seconds"], counts, dashboards)
                time.sleep(0.5)
            self._bar(max(elapsed, o["seconds"]), o["seconds"], counts, dashboards)
        finally:
            stop.set()
            producer.join(5)
            worker.stop(timeout=15)
        if dashboards is not None:
            last = dashboards.refresh_last(traffic_ended=time.monotonic())
            while last.is_alive():
                self._bar(max(elapsed, o["seconds"]), o["seconds"], counts, dashboards)
                last.join(0.5)
            self._bar(max(elapsed, o["seconds"]), o["seconds"], counts, dashboards)
        self.stdout.write("")
        if dashboards is not None and dashboards.error:
            self.stderr.write(f"the dashboards job failed: {dashboards.error} (Spark's output: {dashboards.log})")
        filled = (
            ""
            if dashboards is None or dashboards.filled_at is None
            else f"\n  the dashboards were filled {dashboards.filled_at:.0f} s after the start"
            f" (Spark's output: {dashboards.log})"
        )
        self.stdout.write(
            f"done: {counts['sent']} sent, {counts['processed']} processed, {counts['failed']} failed attempts."
            f"{filled}\n  overview:   {url}/admin/overview/\n  dashboards: {url}/admin/dashboards/?queue=demo-orders"
        )

    def _bar(self, elapsed: float, total: float, counts: dict[str, int], dashboards: Dashboards | None) -> None:
        width = 30
        done = int(width * min(1.0, elapsed / total)) if total else width
        self.stdout.write(
            f"\r[{'#' * done}{'.' * (width - done)}] {elapsed:4.0f}/{total:.0f} s  "
            f"sent {counts['sent']}  processed {counts['processed']}  failed {counts['failed']}"
            + ("" if dashboards is None else f"  dashboards: {dashboards.state}").ljust(40),
            ending="",
        )
        self.stdout.flush()

    def _app_token(self) -> str:
        from rest_framework.authtoken.models import Token

        key: str | None = Token.objects.filter(user__username="app").values_list("key", flat=True).first()
        if not key:
            raise CommandError("no API token: pass --token, set QUEUE_API_TOKEN, or start the node with `make run`")
        return key

    def _setup(self, client: Client, url: str, token: str) -> None:
        """The demo's queues, topic and subscriptions; those that exist are kept as they are."""
        from mq_client import errors

        queues: list[tuple[str, _QueueSettings]] = [(DEAD, {"partitions": 1}), *QUEUES.items()]
        for name, fields in queues:
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
