"""The archive: messages copied from the key-value store to a table of the backing store
(PostgreSQL in production), for slow subscriptions, replay and the latency figures.

The partition owners journal messages in the store (``queues.engine.archive_journal``); the archiver
(``archive.archiver``, a Celery periodic task and ``manage.py archive_now``) copies the journal
to :class:`archive.models.ArchivedMessage`, one active archiver per queue at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from queues.public import StoredMessage


def lookup(message_ids: Iterable[str]) -> dict[str, StoredMessage]:
    """``{message id: StoredMessage}`` for the archived ones among ``message_ids``."""
    from archive.archiver import lookup as _lookup

    return _lookup(message_ids)
