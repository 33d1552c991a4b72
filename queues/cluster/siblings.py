"""What the processes of one runnode tell each other without a call.

A runnode of several processes (``runnode --processes N``) is one node to its callers, but each
process serves its own partitions. A dequeue that one process answers from its own memory alone
would leave older messages waiting in a sibling, and a long poll waiting in one process would
not see a message a sibling just stored. So each process keeps a *board*: a small file in
``NODE_SIBLINGS_DIR`` that its siblings map read-only, with one slot per target (a queue, or
``topic/subscription``) saying

- ``oldest``: the wall-clock time the oldest message this process could deliver now has waited
  since (0: none);
- ``due``: the monotonic time its next message in flight becomes deliverable again (0: none;
  ``CLOCK_MONOTONIC`` is one clock for every process of a machine);
- ``waiters``: the long polls of this process waiting for the target.

and, after the slots, how many changes to access (grants, tokens, users: ``queues.access.changes``)
this process has made, which each sibling adds to its own: a cache of those rows is read again
once the sum moves, so a grant revoked or a token deleted through one process is in force in all
of them from the next call on. Beside the board, a wake-up socket (a Unix datagram socket): a process that makes messages
deliverable sends a byte to each sibling whose slot shows waiters, and the sibling's wake thread
wakes its long polls (:meth:`~queues.cluster.node.NodeRuntime.notify`).

A dequeue reads its siblings' slots (:meth:`Board.holders`): a sibling whose oldest message
has waited clearly longer than this process's is asked first, one that holds some is asked when
the dequeue has room left. A slot is a hint, not a promise: a sibling asked may have handed its
messages out meanwhile (it answers with fewer), and two targets whose names hash to one slot
make it name the last one written (a reader that finds another target's tag treats the slot as
"may hold some"). Nothing here is needed for correctness; it decides which process is asked.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

#: Slots of a board: targets hash to one of them (a collision only costs a call that finds nothing).
SLOTS = 1 << 16
#: A slot: target tag (crc32; 0: never written), waiters, oldest (wall s), due (monotonic s).
SLOT = struct.Struct("=IIdd")
#: After the slots: the access changes this process made (see the module's docstring).
CHANGES = struct.Struct("=Q")
CHANGES_AT = SLOTS * SLOT.size
#: Bytes of a board file (sparse: only the slots written take pages).
SIZE = CHANGES_AT + CHANGES.size
#: How often the list of siblings is read again from the folder (seconds).
RESCAN = 1.0
BOARD_SUFFIX = ".board"
WAKE_SUFFIX = ".wake"


def slot_of(target: str) -> tuple[int, int]:
    """``(slot index, tag)`` of ``target``."""
    tag = zlib.crc32(target.encode()) or 1
    return tag & (SLOTS - 1), tag


class _Sibling:
    __slots__ = ("address", "board", "pid", "wake")

    def __init__(self, pid: int, address: str, board: mmap.mmap, wake: str) -> None:
        self.pid, self.address, self.board, self.wake = pid, address, board, wake


class Board:
    """This process's board and its view of its siblings' (see the module's docstring).

    ``folder``: ``NODE_SIBLINGS_DIR``, where each process also lists its address in a file named
    by its pid (``config.node``). ``on_wake``: called on the wake thread when a sibling wakes
    this process's long polls.
    """

    def __init__(self, folder: str | Path, on_wake: Callable[[], None], pid: int | None = None) -> None:
        self.folder = Path(folder)
        self.pid = pid if pid is not None else os.getpid()
        path = self.folder / f"{self.pid}{BOARD_SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self._mine = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._lock = threading.Lock()  # read-modify-write of this process's slots
        self._wake_path = str(self.folder / f"{self.pid}{WAKE_SUFFIX}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._wake_path)
        self._inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._inbox.bind(self._wake_path)
        self._outbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._outbox.setblocking(False)
        self._on_wake = on_wake
        #: the access changes of the siblings that have ended (so their sum never goes back),
        #: and the live siblings, swapped together by a rescan.
        self._view: tuple[int, list[_Sibling]] = (0, [])
        self._scanned_at = float("-inf")
        self._closed = False
        self._thread = threading.Thread(target=self._wake_loop, name="sibling-wake", daemon=True)
        self._thread.start()

    # --- this process's slots -----------------------------------------------------------------
    def publish(self, target: str, oldest: float | None, due: float | None) -> None:
        """Say what this process could deliver of ``target`` now, then wake the siblings whose
        long polls wait for it when it holds something deliverable now (``oldest``, or ``due``
        passed). A message that comes due later wakes nobody: the waiters' own deadline does
        (:meth:`next_due`)."""
        index, tag = slot_of(target)
        offset = index * SLOT.size
        with self._lock:
            _, waiters, _, _ = SLOT.unpack_from(self._mine, offset)
            SLOT.pack_into(self._mine, offset, tag, waiters, oldest or 0.0, due or 0.0)
        if oldest is not None or (due is not None and due <= time.monotonic()):
            self.wake(target)

    @contextlib.contextmanager
    def waiting(self, target: str) -> Iterator[None]:
        """Count a long poll of this process waiting for ``target`` (siblings wake it)."""
        index, _ = slot_of(target)
        offset = index * SLOT.size
        self._add_waiter(offset, 1)
        try:
            yield
        finally:
            self._add_waiter(offset, -1)

    def _add_waiter(self, offset: int, delta: int) -> None:
        with self._lock:
            tag, waiters, oldest, due = SLOT.unpack_from(self._mine, offset)
            SLOT.pack_into(self._mine, offset, tag, max(0, waiters + delta), oldest, due)

    def count_changes(self, made: int) -> None:
        """Say that this process has made ``made`` access changes so far."""
        CHANGES.pack_into(self._mine, CHANGES_AT, made)

    # --- the siblings' ------------------------------------------------------------------------
    def siblings_changes(self) -> int:
        """The access changes the siblings have made, summed: those that ended too, so that the
        sum only grows (a cache kept under one sum is never trusted again)."""
        self.siblings()
        ended, live = self._view
        return ended + sum(int(CHANGES.unpack_from(s.board, CHANGES_AT)[0]) for s in live)

    def holders(self, target: str, now_mono: float | None = None) -> list[tuple[float, str]]:
        """``(oldest, address)`` of each sibling that may hold a deliverable message of
        ``target``, the longest waiting first (``oldest``: wall time; a slot of another target,
        or a message in flight that came due, counts as waiting since now)."""
        index, tag = slot_of(target)
        offset = index * SLOT.size
        now_mono = time.monotonic() if now_mono is None else now_mono
        now = time.time()
        out = []
        for s in self.siblings():
            seen, _, oldest, due = SLOT.unpack_from(s.board, offset)
            if seen == 0:
                continue
            if seen != tag:
                out.append((now, s.address))
            elif oldest:
                out.append((oldest, s.address))
            elif due and due <= now_mono:
                out.append((now - (now_mono - due), s.address))
        out.sort()
        return out

    def next_due(self, target: str) -> float | None:
        """The earliest monotonic time a sibling's message of ``target`` comes due (None: none)."""
        index, tag = slot_of(target)
        offset = index * SLOT.size
        dues = []
        for s in self.siblings():
            seen, _, _, due = SLOT.unpack_from(s.board, offset)
            if seen == tag and due:
                dues.append(due)
        return min(dues, default=None)

    def wake(self, target: str) -> None:
        """Wake the siblings with long polls waiting for ``target``."""
        index, _ = slot_of(target)
        offset = index * SLOT.size
        for s in self.siblings():
            _, waiters, _, _ = SLOT.unpack_from(s.board, offset)
            if waiters:
                with contextlib.suppress(OSError):  # gone, or its inbox full: it is awake anyway
                    self._outbox.sendto(b"w", s.wake)

    def siblings(self) -> list[_Sibling]:
        """The live siblings (read from the folder at most every :data:`RESCAN` seconds)."""
        now = time.monotonic()
        if now - self._scanned_at < RESCAN:
            return self._view[1]
        self._scanned_at = now
        ended, old = self._view
        known = {s.pid: s for s in old}
        found: list[_Sibling] = []
        try:
            names = os.listdir(self.folder)
        except OSError:
            names = []
        for name in names:
            if not name.isdigit() or int(name) == self.pid:
                continue
            pid = int(name)
            if pid in known:
                found.append(known.pop(pid))
                continue
            try:
                os.kill(pid, 0)
                address = (self.folder / name).read_text().strip()
                with open(self.folder / f"{pid}{BOARD_SUFFIX}", "rb") as f:
                    board = mmap.mmap(f.fileno(), SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
            except (OSError, ValueError):
                continue  # gone, or not started yet: seen at a later look
            if address:
                found.append(_Sibling(pid, address, board, str(self.folder / f"{pid}{WAKE_SUFFIX}")))
        for gone in known.values():
            # its count stays in the sum; its map is closed when no reader holds the old list
            with contextlib.suppress(ValueError):
                ended += CHANGES.unpack_from(gone.board, CHANGES_AT)[0]
        self._view = (ended, found)
        return found

    # --- wake-ups -----------------------------------------------------------------------------
    def _wake_loop(self) -> None:
        while not self._closed:
            try:
                self._inbox.recv(64)
            except OSError:
                if self._closed:
                    return
                time.sleep(0.1)
                continue
            try:
                self._on_wake()
            except Exception:
                log.exception("waking this process's long polls")

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._outbox.sendto(b"x", self._wake_path)  # ends the wake thread's recv
        with contextlib.suppress(OSError):
            os.unlink(self._wake_path)
        with contextlib.suppress(OSError):
            os.unlink(self.folder / f"{self.pid}{BOARD_SUFFIX}")
        self._inbox.close()
        self._outbox.close()
