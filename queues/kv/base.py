"""The key-value store interface.

Keys are ``/``-separated paths; a message's key is its message ID
(``<queue>/<partition>/<block id>/<index>``). A key's *bucket* is everything before its last
``/`` and its *name* what follows; :meth:`KeyValueStore.scan` lists the names in one bucket,
which is how a new owner learns which positions of a block still hold messages. Backends
store a bucket together (a directory, a Redis hash, rows sharing a column), so a scan costs
one read whatever the size of the store.

Fencing: an owner writes with ``fence=Fence(key, epoch)``; the write happens only if the value
stored at ``key`` is that epoch, checked atomically with the write. A new owner first raises the
fence (:meth:`KeyValueStore.advance_fence`), after which every write of the previous owner
fails with :class:`Fenced` and changes nothing (:meth:`KeyValueStore.raise_fence` says whether
the caller raised it, or found it there already). The partition manager fences every write it
makes, acks included (a stale owner's delete would leave the new owner tracking a message
that is gone); unfenced writes are for callers outside the lease, such as a queue's purge.
"""

from __future__ import annotations

import abc
import functools
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from queues import metrics
from queues.errors import Unavailable


class KVError(Unavailable):
    """The store failed; nothing may be assumed written."""


class ReplicationError(KVError):
    """Fewer replicas than required acknowledged a write (it may exist on the primary only)."""


class Fenced(KVError):
    """A fenced write was refused: another owner holds a newer epoch."""


@dataclass(frozen=True, slots=True)
class Fence:
    #: the key holding the current epoch (ASCII decimal).
    key: str
    #: the epoch the writer believes is current.
    epoch: int


def split_key(key: str) -> tuple[str, str]:
    """``"a/b/c"`` -> ``("a/b", "c")``."""
    bucket, sep, name = key.rpartition("/")
    if not sep or not bucket or not name:
        raise ValueError(f"key {key!r} needs a bucket and a name")
    return bucket, name


class KeyValueStore(abc.ABC):
    """What a backend fills in. Batches are the unit of I/O: each method is one round trip."""

    #: URL scheme(s) this backend answers to, for the registry.
    schemes: tuple[str, ...] = ()
    #: the ``backend`` label of the store metrics (``RedisStore`` -> ``redis``).
    metrics_name: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Time every backend's calls, in this one place: each interface method a backend
        defines is wrapped (``queues.metrics``: ``mq_store_call_seconds``, ``mq_store_errors``)."""
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("metrics_timed", True):
            return  # a view over another store: the store under it is timed
        name = cls.__dict__.get("metrics_name") or cls.__name__.removesuffix("Store").lower()
        cls.metrics_name = name
        for op in _TIMED:
            fn = cls.__dict__.get(op)
            if fn is not None and not getattr(fn, "_timed", False):
                setattr(cls, op, _timed(fn, name, op))

    @abc.abstractmethod
    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values of ``keys`` in order, None where absent."""

    @abc.abstractmethod
    def put_many(self, items: Sequence[tuple[str, bytes]], *, fence: Fence | None = None) -> None:
        """Store every item, all or nothing where the backend can (see each backend)."""

    @abc.abstractmethod
    def delete_many(self, keys: Sequence[str], *, fence: Fence | None = None) -> int:
        """Delete the keys; returns how many existed. Absent keys are not an error."""

    @abc.abstractmethod
    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """The conditional put: store ``value`` only if the current value is ``expected``
        (None: only if absent). True if it was stored."""

    @abc.abstractmethod
    def scan(self, bucket: str) -> list[str]:
        """Names of the keys directly in ``bucket`` (unordered)."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Remove every key under ``prefix/`` at any depth (queue deletion; not a hot path)."""

    def close(self) -> None:  # noqa: B027 - optional hook: stores without connections keep it
        """Release connections."""

    def within(self, prefix: str) -> KeyValueStore:
        """A view of this store in which every key, bucket and prefix starts with ``prefix``
        (see :class:`PrefixedStore`)."""
        return PrefixedStore(self, prefix)

    # --- conveniences built on the batch calls ------------------------------------------------
    def get(self, key: str) -> bytes | None:
        return self.get_many([key])[0]

    def put(self, key: str, value: bytes, *, fence: Fence | None = None) -> None:
        self.put_many([(key, value)], fence=fence)

    def delete(self, key: str, *, fence: Fence | None = None) -> int:
        return self.delete_many([key], fence=fence)

    def read_fence(self, key: str) -> int:
        raw = self.get(key)
        return int(raw) if raw is not None else 0

    def advance_fence(self, key: str, epoch: int) -> bool:
        """Raise the fence at ``key`` to ``epoch`` by compare-and-set; never lowers it.

        Returns False if the stored epoch is newer than ``epoch`` (someone newer owns).
        """
        return self.raise_fence(key, epoch) <= epoch

    def raise_fence(self, key: str, epoch: int) -> int:
        """Raise the fence at ``key`` to ``epoch`` if it is below, by compare-and-set; returns
        the epoch it held before (0: none). Never lowers it.

        The caller raised it, and alone owns ``epoch``, only if the answer is below ``epoch``.
        A fence already *at* ``epoch`` was raised by someone else who was given the same epoch:
        a partition row restored from a backup hands epochs out again, so an owner that opens
        must not take such a fence for its own (``PartitionManager.open_head`` moves past it).
        """
        while True:
            raw = self.get(key)
            current = int(raw) if raw is not None else 0
            if current >= epoch:
                return current
            if self.compare_and_set(key, raw, str(epoch).encode()):
                return current


#: the interface methods whose latency and errors are measured.
_TIMED = ("get_many", "put_many", "delete_many", "compare_and_set", "scan", "delete_prefix")


def _timed(fn: Callable[..., Any], backend: str, op: str) -> Callable[..., Any]:
    seconds = metrics.STORE_CALLS.labels(backend, op)
    errors = metrics.STORE_ERRORS.labels(backend, op)

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except Fenced:
            raise  # the store answered: a stale owner's write, not a store failure
        except Exception:
            errors.inc()
            raise
        finally:
            seconds.observe(time.perf_counter() - started)

    timed._timed = True  # type: ignore[attr-defined]
    return timed


#: What a prefix may be made of: it becomes part of a Redis key, a file name, a column value,
#: and must not contain the ``/`` that separates buckets (nor glob or LIKE wildcards).
PREFIX = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]*$")


class PrefixedStore(KeyValueStore):
    """Every key, bucket, fence and prefix of ``inner``, with ``prefix`` put in front.

    The service's store is such a view (``KV_PREFIX``, by :func:`queues.kv.get_store`), so
    nothing it writes, and nothing its ``delete_prefix`` can reach, lies outside the prefix:
    a queue named ``celery`` is ``mq:celery`` in a Redis database it shares with Celery's
    broker. Views nest (a queue's incarnation is a view of the service's view). Scanned names
    come back as they are: names are the last segment, never prefixed.
    """

    metrics_timed = False

    def __init__(self, inner: KeyValueStore, prefix: str):
        if not PREFIX.fullmatch(prefix):
            raise ValueError(f"key prefix {prefix!r}: use letters, digits and _ . : - (no /), not empty")
        self.inner = inner
        self.prefix = prefix
        self.schemes = inner.schemes

    def within(self, prefix: str) -> KeyValueStore:
        # One layer, not a view of a view: each key is built once on the hot path.
        return PrefixedStore(self.inner, self.prefix + prefix)

    def _fence(self, fence: Fence | None) -> Fence | None:
        return None if fence is None else Fence(self.prefix + fence.key, fence.epoch)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return self.inner.get_many([self.prefix + k for k in keys])

    def put_many(self, items: Sequence[tuple[str, bytes]], *, fence: Fence | None = None) -> None:
        self.inner.put_many([(self.prefix + k, v) for k, v in items], fence=self._fence(fence))

    def delete_many(self, keys: Sequence[str], *, fence: Fence | None = None) -> int:
        return self.inner.delete_many([self.prefix + k for k in keys], fence=self._fence(fence))

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        return self.inner.compare_and_set(self.prefix + key, expected, value)

    def scan(self, bucket: str) -> list[str]:
        return self.inner.scan(self.prefix + bucket)

    def delete_prefix(self, prefix: str) -> None:
        if not prefix:
            raise ValueError("delete_prefix needs a non-empty prefix")
        self.inner.delete_prefix(self.prefix + prefix)

    def read_fence(self, key: str) -> int:
        return self.inner.read_fence(self.prefix + key)

    def advance_fence(self, key: str, epoch: int) -> bool:
        return self.inner.advance_fence(self.prefix + key, epoch)

    def raise_fence(self, key: str, epoch: int) -> int:
        return self.inner.raise_fence(self.prefix + key, epoch)

    def close(self) -> None:
        self.inner.close()
