"""The filesystem backend: one file per key, the file's path is the key (as in the seed).

``file:///var/lib/mq/kv`` stores message ``orders/0/0000002a-9f…/17`` in the file
``/var/lib/mq/kv/orders/0/0000002a-9f…/17``.

Durability: a batch is written to temporary files, flushed, renamed into place and the
directories flushed, so a reader sees a whole value or none, and a batch reported written
survives a crash. Flushing uses ``syncfs`` (one call per filesystem per batch) where Linux
has it, which costs about one ``fsync`` instead of one per file. Deletes are not flushed: a
delete lost in a crash brings an acknowledged message back, which at-least-once allows.

Fencing: a fenced write holds a shared ``flock`` on ``<fence>.lock`` while it checks the epoch
and writes; :meth:`compare_and_set` holds it exclusively. So raising the fence waits for the
writes in progress, and every write after it sees the new epoch.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from queues.kv.base import Fence, Fenced, KeyValueStore, KVError, split_key

# ":" for the key prefix (``KV_PREFIX``, "mq:" by default) that starts every key of the service.
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]*$")


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syncfs
        fn.argtypes = [ctypes.c_int]
        return fn
    except (OSError, AttributeError):
        return None


_syncfs = _load_syncfs()


class FileStore(KeyValueStore):
    schemes = ("file",)

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)

    @classmethod
    def from_url(cls, url: str) -> FileStore:
        if not url.startswith("file://"):
            raise ValueError(f"not a file URL: {url}")
        path = url[len("file://") :]
        if not path.startswith("/"):
            raise ValueError(f"file URL needs an absolute path (file:///...): {url}")
        return cls(path)

    def close(self) -> None:
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1

    # --- paths --------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        split_key(key)
        return self._dir(key)

    def _dir(self, path: str) -> Path:
        """``path``'s place under the root; every segment must be a safe file name, so no
        ``..``, empty or hidden segment can lead outside the root (keys, buckets, prefixes)."""
        parts = path.split("/")
        for part in parts:
            if not _SEGMENT.fullmatch(part) or part.endswith(".lock"):
                raise ValueError(f"key segment {part!r} of {path!r} is not a safe file name")
        return self.root.joinpath(*parts)

    def _flush(self, fds_or_paths: Sequence[int]) -> None:
        if _syncfs is not None:
            if _syncfs(self._root_fd) != 0:
                err = ctypes.get_errno()
                raise KVError(f"syncfs failed: {os.strerror(err)}")
            return
        for fd in fds_or_paths:
            os.fsync(fd)

    @contextmanager
    def _fenced(self, fence: Fence | None, exclusive: bool = False) -> Iterator[None]:
        if fence is None:
            yield
            return
        path = self._path(fence.key)
        lock_path = path.with_name(path.name + ".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            current = self._read(path)
            if current is None or int(current) != fence.epoch:
                raise Fenced(f"{fence.key}: epoch {fence.epoch} is not current ({current!r})")
            yield
        finally:
            os.close(fd)  # closing releases the flock

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None

    # --- the interface ------------------------------------------------------------------------
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self._read(self._path(k)) for k in keys]

    def put_many(self, items: Sequence[tuple[str, bytes]], *, fence: Fence | None = None) -> None:
        if not items:
            return
        targets = [(self._path(k), v) for k, v in items]
        with self._fenced(fence):
            self._write_atomically(targets)

    def _write_atomically(self, targets: list[tuple[Path, bytes]]) -> None:
        tmp_paths: list[tuple[Path, Path]] = []
        fds: list[int] = []
        try:
            for path, value in targets:
                tmp = path.with_name(f".tmp-{secrets.token_hex(6)}")
                try:
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileNotFoundError:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                fds.append(fd)
                tmp_paths.append((tmp, path))
                view = memoryview(value)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            self._flush(fds)
            for tmp, path in tmp_paths:
                os.replace(tmp, path)
            # The renames are directory entries: flush them too before reporting success.
            if _syncfs is not None:
                self._flush([])
            else:
                for parent in {p.parent for _, p in tmp_paths}:
                    dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        os.fsync(dfd)
                    finally:
                        os.close(dfd)
        except OSError as exc:
            for tmp, _ in tmp_paths:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise KVError(f"write failed: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)

    def delete_many(self, keys: Sequence[str], *, fence: Fence | None = None) -> int:
        paths = [self._path(k) for k in keys]
        removed = 0
        with self._fenced(fence):
            for path in paths:
                try:
                    os.unlink(path)
                    removed += 1
                except FileNotFoundError:
                    continue
                self._remove_empty_dir(path.parent)
        return removed

    def _remove_empty_dir(self, directory: Path) -> None:
        # A block's directory goes when its last message does; a writer racing with this
        # recreates it (see _write_atomically).
        if directory == self.root:
            return
        try:
            os.rmdir(directory)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.EBUSY):
                raise

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        path = self._path(key)
        lock_path = path.with_name(path.name + ".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._read(path) != expected:
                return False
            self._write_atomically([(path, value)])
            return True
        finally:
            os.close(fd)

    def scan(self, bucket: str) -> list[str]:
        directory = self._dir(bucket)
        try:
            with os.scandir(directory) as entries:
                # d_type from the directory listing: no stat per entry.
                return [
                    e.name
                    for e in entries
                    if not e.name.startswith(".") and not e.name.endswith(".lock") and e.is_file()
                ]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete_prefix(self, prefix: str) -> None:
        directory = self._dir(prefix)  # "" and "/" (the whole store) are refused here too
        shutil.rmtree(directory, ignore_errors=True)
