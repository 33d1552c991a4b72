"""The ``X-MQ-Served-By`` header: which partition managers served a message call
(``queues.service.served``; on with ``SERVED_BY_HEADER``), as
``<node id>:<queue>/<index>:<epoch>[, ...]``, each once, in the order they served it."""

from __future__ import annotations

from collections.abc import Sequence

#: The answer's header that names who served a message call.
HEADER = "X-MQ-Served-By"


def header_items(entries: Sequence[str]) -> list[tuple[str, str]]:
    """The header for an answer whose call was served by ``entries`` (none: no header)."""
    return [(HEADER, ", ".join(entries))] if entries else []


def parse(value: str) -> list[str]:
    """The entries a header's value names."""
    return [entry for entry in (part.strip() for part in value.split(",")) if entry]
