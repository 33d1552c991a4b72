"""The embedded Celery broker: kombu's filesystem transport, with every file written whole.

kombu's filesystem transport (``filesystem://``) creates a message file and only then writes
into it; its consumers take no lock, so one that lists the folder in that moment takes the
empty or half-written file, fails to parse it, and the worker stops (``JSONDecodeError`` in
the transport's ``_get``; kombu issue #1551). Its exchange tables have the same gap: a new
table is truncated and written by whichever process binds first, so a second binder or a
publisher reading it at that moment sees an empty file.

This transport keeps kombu's folders, file names and message format, and changes how files
are written and taken:

* a message is written under a hidden name that no listing matches, then renamed into the
  queue's folder: a consumer sees it whole or not at all (a rename is atomic on POSIX);
* a consumer claims a message by renaming it into the ``processed`` folder (the same file
  system, so two consumers never both get it, as they could when kombu copied it to the
  system's temporary folder), then reads it there;
* a message it cannot parse (one written in place by some other writer, not yet finished) is
  put back and left for a later poll; one still unreadable after :data:`UNREADABLE_GRACE`
  seconds is set aside as ``<name>.unreadable`` in the ``processed`` folder and logged,
  never raised into the worker;
* an exchange table is changed under a lock of its own and replaced whole.

Settings select it for ``CELERY_BROKER_URL=filesystem://`` (``CELERY_BROKER_TRANSPORT``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads
from kombu.utils.objects import cached_property

logger = logging.getLogger(__name__)

#: Seconds a message that cannot be parsed stays in its queue (its writer may not be done).
UNREADABLE_GRACE = 30.0
#: Prefix of the files being written: hidden, and never ``<queue>.msg`` after the first dot.
_PARTIAL = ".partial-"


def write_whole(folder: str | os.PathLike[str], name: str, data: bytes) -> Path:
    """Write ``data`` to ``folder/name`` so that a reader sees all of it or no file: written
    under a hidden name first, then renamed into place."""
    target = Path(folder) / name
    partial = Path(folder) / f"{_PARTIAL}{uuid.uuid4().hex}"
    try:
        with open(partial, "xb") as f:
            f.write(data)
        os.replace(partial, target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise ChannelError(f"Cannot add file {str(target)!r} to directory") from exc
    return target


class Channel(filesystem.Channel):
    """kombu's filesystem channel, with messages and exchange tables written whole."""

    # --- messages -------------------------------------------------------------------------
    # (kombu's filesystem channel names the message ``payload``, its base class ``message``)
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` onto ``queue``: serialised first, then written whole."""
        data = str_to_bytes(dumps(payload))
        # kombu's name: consumers take the files in name order (milliseconds first)
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        write_whole(self.data_folder_out, name, data)

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        """Take the oldest message of ``queue``; :class:`queue.Empty` if there is none."""
        wanted = f"{queue}.msg"
        inbox = Path(self.data_folder_in)
        claims = self._claims
        for name in sorted(os.listdir(inbox)):
            if name.partition(".")[2] != wanted:
                continue
            claimed = claims / name
            try:
                os.rename(inbox / name, claimed)
            except FileNotFoundError:
                continue  # another consumer took it
            except OSError as exc:
                raise ChannelError(f"Cannot move {name!r} to {str(claims)!r}") from exc
            try:
                payload = claimed.read_bytes()
            except OSError as exc:
                raise ChannelError(f"Cannot read file {str(claimed)!r} from queue.") from exc
            try:
                message = loads(bytes_to_str(payload))
            except ValueError:
                self._unreadable(claimed, inbox / name)
                continue
            if not self.store_processed:
                claimed.unlink(missing_ok=True)
            return message
        raise Empty()

    @cached_property
    def _claims(self) -> Path:
        """Where a consumer moves the message it takes: the ``processed`` folder, made if need be
        (a rename into a missing folder would read as a message another consumer took)."""
        folder = Path(self.processed_folder)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    @staticmethod
    def _unreadable(claimed: Path, original: Path) -> None:
        """A message that does not parse: back into its queue while its writer may still be
        writing it, set aside once it is older than :data:`UNREADABLE_GRACE`."""
        try:
            age = time.time() - claimed.stat().st_mtime
            if age < UNREADABLE_GRACE:
                os.rename(claimed, original)
                return
            aside = claimed.with_name(f"{claimed.name}.unreadable")
            os.rename(claimed, aside)
        except OSError:
            logger.warning("broker: an unreadable message %s could not be moved", claimed, exc_info=True)
            return
        logger.error("broker: a message unreadable for %.0f s was set aside as %s", age, aside)

    # --- exchange tables ------------------------------------------------------------------
    def _exchange_file(self, exchange: str) -> Path:
        """kombu's: the file of ``exchange``'s table (typed here: kombu's is unannotated)."""
        file: Path = super()._exchange_file(exchange)  # type: ignore[no-untyped-call]  # (kombu's, unannotated)
        return file

    def get_table(self, exchange: str) -> list[filesystem.exchange_queue_t]:
        file = self._exchange_file(exchange)
        try:
            table = loads(bytes_to_str(file.read_bytes()))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc
        except ValueError as exc:
            raise ChannelError(f"Cannot parse the exchange table {file}") from exc
        return [filesystem.exchange_queue_t(*q) for q in table]

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def add(table: list[filesystem.exchange_queue_t]) -> bool:
            if binding in table:
                return False
            table.insert(0, binding)
            return True

        self._change_table(exchange, add)

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any) -> None:
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        binding = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")

        def remove(table: list[filesystem.exchange_queue_t]) -> bool:
            if binding not in table:
                return False
            table.remove(binding)
            return True

        self._change_table(exchange, remove, create=False)

    def _change_table(
        self, exchange: str, change: Callable[[list[filesystem.exchange_queue_t]], bool], create: bool = True
    ) -> None:
        """Read, change and replace an exchange's table, one process at a time."""
        file = self._exchange_file(exchange)
        with self._table_lock(file):
            if not create and not file.exists():
                return
            table = self.get_table(exchange)
            if change(table):
                write_whole(file.parent, file.name, str_to_bytes(dumps(table)))

    @contextmanager
    def _table_lock(self, file: Path) -> Iterator[None]:
        """An exclusive lock for changing ``file``, on a file of its own (the table is replaced,
        so a lock on it would be a lock on a file that is gone)."""
        try:
            file.parent.mkdir(exist_ok=True)
            with open(file.parent / f".{file.name}.lock", "ab") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                yield
        except OSError as exc:
            raise ChannelError(f"Cannot lock {file}") from exc


class Transport(filesystem.Transport):
    """The filesystem transport with :class:`Channel`."""

    Channel = Channel
    # kombu's filesystem transport keeps its exchanges in one state per process; so does this.
    global_state = virtual.BrokerState()
