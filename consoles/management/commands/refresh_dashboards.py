"""``python manage.py refresh_dashboards``: run the dashboards' Spark job now, with one progress
line; the Spark process's own output goes to ``--spark-log`` (``$MQ_DATA_DIR/spark.log``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


def _positive(minimum: int = 1) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``, else a usage error naming the option."""

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, not {raw!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    return parse


@contextlib.contextmanager
def _stderr_to(path: str) -> Iterator[None]:
    """This process's standard error (file descriptor 2) appended to ``path`` meanwhile: the Spark
    process it starts writes its warnings there (native libraries it cannot load, its own log),
    not over the command's progress line. ``-``: left as it is."""
    if path == "-":
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


class Command(BaseCommand):
    help = (
        "Compute the dashboards' figures and the queues' learned time estimates from the attempt "
        "log with Spark (local mode, or the cluster named by SPARK_MASTER)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--bucket",
            type=_positive(),
            default=settings.DASHBOARDS_BUCKET,
            help="seconds per time bucket (default DASHBOARDS_BUCKET=%(default)s)",
        )
        parser.add_argument(
            "--window",
            type=_positive(),
            default=settings.DASHBOARDS_WINDOW,
            help="seconds of attempt log to read (default DASHBOARDS_WINDOW=%(default)s)",
        )
        parser.add_argument(
            "--min-samples",
            type=_positive(2),
            default=settings.DASHBOARDS_MIN_SAMPLES,
            help="samples a queue needs before its estimates are learned (default %(default)s)",
        )
        parser.add_argument(
            "--spark-log",
            default=str(Path(settings.DATA_DIR) / "spark.log"),
            help="where the Spark process's own output (warnings, its log) goes (default %(default)s; "
            "'-' leaves it on the terminal)",
        )
        parser.add_argument(
            "--no-apply", action="store_true", help="record the learned estimates without changing the queues' defaults"
        )

    def handle(
        self, *args: str, bucket: int, window: int, min_samples: int, no_apply: bool, spark_log: str, **options: Any
    ) -> None:
        from consoles.spark import job

        opts = job.Options(
            bucket_seconds=bucket, window_seconds=window, min_samples=min_samples, apply_estimates=not no_apply
        )
        try:
            opts.validate()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        started = time.perf_counter()
        last = {"t": started}

        def progress(step: int, steps: int, text: str) -> None:
            now = time.perf_counter()
            if step > 1:
                self.stdout.write(f"  ({now - last['t']:.1f} s)")
            last["t"] = now
            bar = "#" * step + "." * (steps - step)
            self.stdout.write(f"[{bar}] {step}/{steps} {text}...", ending="")
            self.stdout.flush()

        try:
            with _stderr_to(spark_log):
                run = job.run(opts, trigger="command", progress=progress)
        except Exception as exc:
            self.stdout.write("")
            raise CommandError(f"the dashboards job failed: {type(exc).__name__}: {exc}") from exc
        self.stdout.write(f"  ({time.perf_counter() - last['t']:.1f} s)")
        fits = run.estimate_fits.order_by("queue", "stage")
        self.stdout.write(
            self.style.SUCCESS(
                f"Done in {time.perf_counter() - started:.1f} s: {run.attempts_read:,} attempts ({run.source}), "
                f"{run.queues} queue(s), read {run.read_seconds:.1f} s, compute {run.transform_seconds:.1f} s, "
                f"write {run.write_seconds:.1f} s."
            )
        )
        for fit in fits:
            change = "" if fit.previous is None else f" (was {fit.previous:.3f} s)"
            note = "" if fit.applied else " [not applied]"
            self.stdout.write(
                f"  {fit.queue} {fit.stage}: {fit.estimate:.3f} s at size {fit.median_size:g}"
                f"{change}, n={fit.n}, r2={'-' if fit.r2 is None else f'{fit.r2:.3f}'}{note}"
            )
