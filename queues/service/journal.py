"""The archive journal's drain, for the archive app (``archive.archiver``).

A partition's owner leaves each message it stores, and a marker for each it acknowledges, in
the key-value store's journal of that partition (``queues.engine.archive_journal``), under its
queue row's incarnation. The archiver copies them to its table: it reads a batch
(:func:`read_journal`), commits its rows, and only then drops exactly the names it read
(:func:`drop_journal`), so an entry is never lost (at worst copied twice). These functions take
no lock and check no permission: the archiver is the service's own bookkeeping, run by the
host (``manage.py archive_now``, a Celery task); its per-queue lock is the archive's.

The app also gives the runtime its table as the archive of topics that archive
(:func:`install_archive`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from queues.cluster import hooks
from queues.engine import archive_journal, keys
from queues.engine.ids import StoredMessage
from queues.kv import KeyValueStore, get_store
from queues.models import Queue


@dataclass(frozen=True, slots=True)
class JournalQueue:
    """A queue (or topic) row whose journal the archiver drains."""

    name: str
    #: the row's id: the incarnation whose journal this is (a queue created since under the
    #: same name has another).
    incarnation: int
    partitions: int
    #: its archive mode (``none``: archiving off; its journal may still hold what was left).
    archive: str


@dataclass(frozen=True, slots=True)
class JournalBatch:
    """What one read of a partition's journal found."""

    #: ``(message id, its stored record)``, by message ID; an entry removed since the scan
    #: (another archiver, a purge) is left out.
    entries: list[tuple[str, bytes]]
    #: ``(message id, the marker's value: when it was acknowledged, wall-clock seconds as text)``
    #: of the markers read: those of the entries read, and those whose entry is not journaled.
    acks: list[tuple[str, bytes]]
    #: every journal name this read covers (the entries' and markers' names, and names that are
    #: neither): :func:`drop_journal` them once what they say is committed, and nothing else.
    names: list[str]
    #: whether the journal held names this batch did not take.
    more: bool


def journal_queues(name: str | None = None) -> list[JournalQueue]:
    """Every queue and topic row (or the one named ``name``; none if there is no such), by
    name."""
    rows = Queue.objects.order_by("name")
    if name is not None:
        rows = rows.filter(name=name)
    return [
        JournalQueue(name, pk, partitions, archive)
        for name, pk, partitions, archive in rows.values_list("name", "pk", "partitions", "archive")
    ]


def _view(store: KeyValueStore | None, incarnation: int) -> KeyValueStore:
    return (store or get_store()).within(keys.incarnation(incarnation))


def journal_holds(queue: JournalQueue, *, store: KeyValueStore | None = None) -> bool:
    """Whether any partition's journal of ``queue`` holds a name (one scan per partition until
    one does). ``store``: the store to read (default: this process's). Raises ``KVError``."""
    view = _view(store, queue.incarnation)
    return any(view.scan(archive_journal.bucket(queue.name, p)) for p in range(queue.partitions))


def read_journal(
    queue: str, partition: int, *, incarnation: int, batch: int, store: KeyValueStore | None = None
) -> JournalBatch | None:
    """The oldest ``batch`` entries of partition ``partition``'s journal of queue row
    ``incarnation`` (named ``queue``), with the markers that go with them; None when the
    journal is empty. A marker goes with its entry; one whose entry is not journaled (archived
    earlier, or never: the mode changed) goes alone; one whose entry waits for a later batch
    waits too. One scan and one batched read. Raises ``KVError``."""
    view = _view(store, incarnation)
    bucket = archive_journal.bucket(queue, partition)
    names = view.scan(bucket)
    if not names:
        return None
    entries: dict[str, str] = {}  # message id -> journal name
    markers: dict[str, str] = {}
    junk: list[str] = []
    for name in names:
        parsed = archive_journal.parse_name(queue, partition, name)
        if parsed is None:
            junk.append(name)
        elif parsed[0] == archive_journal.ENTRY:
            entries[parsed[1]] = name
        else:
            markers[parsed[1]] = name
    chosen = sorted(entries)[:batch]
    chosen_set = set(chosen)
    marks = [mid for mid in sorted(markers) if mid in chosen_set or mid not in entries][:batch]
    wanted = [f"{bucket}/{entries[mid]}" for mid in chosen] + [f"{bucket}/{markers[mid]}" for mid in marks]
    values = view.get_many(wanted) if wanted else []
    done = [entries[mid] for mid in chosen] + [markers[mid] for mid in marks] + junk
    return JournalBatch(
        entries=[(mid, raw) for mid, raw in zip(chosen, values[: len(chosen)], strict=True) if raw is not None],
        acks=[(mid, raw) for mid, raw in zip(marks, values[len(chosen) :], strict=True) if raw is not None],
        names=done,
        more=len(done) < len(names),
    )


def drop_journal(
    queue: str, partition: int, names: list[str], *, incarnation: int, store: KeyValueStore | None = None
) -> None:
    """Delete ``names`` (a :class:`JournalBatch`'s, once its rows are committed) from the
    journal, unfenced: the archiver holds no partition lease, and a name deleted after its row
    committed can only be a copy. Raises ``KVError``."""
    if names:
        bucket = archive_journal.bucket(queue, partition)
        _view(store, incarnation).delete_many([f"{bucket}/{n}" for n in names])


def install_archive(
    sink: Callable[[list[tuple[str, bytes]]], object], source: Callable[[list[str]], dict[str, StoredMessage]]
) -> None:
    """Give this process's runtime the archive app's table as the archive of topics that
    archive: ``sink`` keeps what retention removes while a slow subscription still holds it,
    ``source`` reads such messages back (``queues.cluster.hooks``). Partition managers opened
    from then on use it; called by the app's ``ready()``."""
    hooks.install_archive(sink, source)
