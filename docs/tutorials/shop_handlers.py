"""The workers tutorial's handlers: the worker imports this module (WORKER_HANDLERS=shop_handlers)."""

import os
import tempfile
from pathlib import Path

from workers import handler

OUT = Path(os.environ.get("SHOP_OUT") or Path(tempfile.gettempdir()) / "mq-tutorial-sent.txt")


def render(message):  # pre-processing: no ordering needs, may run ahead of the group
    return f"to {message.attributes['to']}: {message.body}"


@handler("emails", preprocess=render)  # processing: in group order, one of a group at a time
def send(message, prepared):
    with OUT.open("a") as f:
        f.write(f"{message.group} {prepared}\n")
