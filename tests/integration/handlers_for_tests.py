"""A handler module for the Celery worker tests (``WORKER_HANDLERS=tests.integration.handlers_for_tests``).

Queue ``work``: pre-processing sleeps ``TEST_PRE`` seconds, processing ``TEST_PROC`` (the issue's
0.3 s / 2.0 s, scaled down). Each worker process appends what it did to its own file in
``TEST_HANDLER_OUT``, one line per event: ``<event> <message id> <receive count>`` with the events
``start`` (processing began) and ``done`` (processing succeeded). The message's attributes choose
a behaviour:

* ``{"behaviour": "fail"}``: always raises;
* ``{"behaviour": "long", "seconds": s}``: processing sleeps ``s`` seconds;
* ``{"behaviour": "hang-first"}``: sleeps 60 s on its first delivery, quick afterwards.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from workers import handler

QUEUE = "work"
_lock = threading.Lock()


def _record(event: str, message) -> None:
    out = Path(os.environ["TEST_HANDLER_OUT"])
    line = f"{event} {message.id} {message.receive_count}\n"
    with _lock, open(out / f"worker-{os.getpid()}.txt", "a") as f:
        f.write(line)


def fetch(message):
    time.sleep(float(os.environ.get("TEST_PRE", "0.006")))
    return message.body


@handler(QUEUE, preprocess=fetch)
def process(message, prepared):
    assert prepared == message.body, "process() got another message's pre-processing"
    _record("start", message)
    attributes = message.attributes or {}
    behaviour = attributes.get("behaviour")
    if behaviour == "fail":
        raise RuntimeError(f"told to fail ({message.id})")
    if behaviour == "long":
        time.sleep(float(attributes["seconds"]))
    elif behaviour == "hang-first" and message.receive_count == 1:
        time.sleep(60)
    else:
        time.sleep(float(os.environ.get("TEST_PROC", "0.04")))
    _record("done", message)


def events(out_dir: Path) -> list[tuple[str, str, int, str]]:
    """Every line of every worker's file: ``(event, message id, receive count, file name)``."""
    found = []
    for path in sorted(out_dir.glob("worker-*.txt")):
        for line in path.read_text().splitlines():
            event, mid, count = line.split(" ")
            found.append((event, mid, int(count), path.name))
    return found
