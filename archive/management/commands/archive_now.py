"""``python manage.py archive_now [--queue NAME]``: one archiver pass, now, in this process."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from archive import archiver
from queues import service


class Command(BaseCommand):
    help = "Copy the archive journal of every queue (or one) to the archive table now."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", help="only this queue")

    def handle(self, *args: str, queue: str | None = None, **options: Any) -> None:
        if queue is not None and queue not in service.current_queue_ids([queue]):
            raise CommandError(f"no queue named {queue!r}")
        report = archiver.run(queue)
        self.stdout.write(json.dumps(report or {}, sort_keys=True))
        busy = [name for name, counts in report.items() if counts.get("busy")]
        if busy:
            self.stderr.write(f"another archiver is working on: {', '.join(busy)}")
