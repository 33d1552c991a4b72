"""What other apps install into the runtime when they start: the archive that topics which
archive hand their slow subscriptions' messages to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from queues.engine.ids import StoredMessage


@dataclass
class ArchiveHooks:
    """Where retention on a topic that archives puts what slow subscriptions still hold
    (``sink``: ``[(message id, stored bytes)]``), and where a delivery reads such a body back
    (``source``: message IDs -> StoredMessage). The archive app installs its table here when it
    starts (``archive.apps``); without it such topics keep their messages in the store."""

    sink: Callable[[list[tuple[str, bytes]]], object] | None = None
    source: Callable[[list[str]], dict[str, StoredMessage]] | None = None


#: The archive this process's partition managers use (see :class:`ArchiveHooks`).
ARCHIVE = ArchiveHooks()


def install_archive(
    sink: Callable[[list[tuple[str, bytes]]], object], source: Callable[[list[str]], dict[str, StoredMessage]]
) -> None:
    """Called by the archive app's ``ready()``; managers opened from then on use it."""
    ARCHIVE.sink, ARCHIVE.source = sink, source
