"""Times as the API writes them: ISO 8601 in UTC, with a ``Z``.

Django-free: the worker pipeline stamps its attempt records with it too.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Literal


def isoformat(
    value: datetime | float | None, timespec: Literal["milliseconds", "microseconds"] = "milliseconds"
) -> str | None:
    """A time (an aware datetime, or wall-clock seconds) as ISO 8601 in UTC with ``Z``, to
    ``timespec``: milliseconds as the API answers, microseconds where a record keeps what
    the clock gave. A naive datetime is taken as UTC; None stays None."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        value = datetime.fromtimestamp(value, tz=UTC)
    elif value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def iso(ts: float) -> str:
    """Wall-clock seconds as :func:`isoformat` writes them (milliseconds), for the hot path.

    The same text as ``isoformat(ts)`` (microseconds rounded half to even, then truncated to
    milliseconds; a unit test pins the two equal), for a fraction of the cost: a dequeue formats
    one per message, and a batch's messages share their second, whose text is kept. The last
    time formatted is kept too: an enqueue stamps its whole batch with one time, so a dequeue's
    messages mostly repeat the one before.
    """
    global _iso_last
    last = _iso_last
    if last[0] == ts:
        return last[1]
    second = math.floor(ts)
    micro = round((ts - second) * 1e6)
    if micro >= 1_000_000:
        second, micro = second + 1, micro - 1_000_000
    prefix = _iso_seconds.get(second)
    if prefix is None:
        if len(_iso_seconds) > 4096:
            _iso_seconds.clear()
        prefix = _iso_seconds[second] = datetime.fromtimestamp(second, tz=UTC).isoformat()[:19]
    text = f"{prefix}.{micro // 1000:03d}Z"
    _iso_last = (ts, text)  # one tuple, swapped whole: a racing reader sees a matching pair
    return text


#: second -> its ``YYYY-MM-DDTHH:MM:SS`` (see :func:`iso`; a race only computes one twice).
_iso_seconds: dict[int, str] = {}
#: the last ``(time, text)`` :func:`iso` made (NaN equals nothing: none yet).
_iso_last: tuple[float, str] = (math.nan, "")
