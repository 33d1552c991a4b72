"""Remembered ``dedup_id``s: a repeat within the queue's window returns the first message's ID.

Production keeps them in Redis (``REDIS_URL``, through django-redis) with a TTL; the embedded
default in the database. A reservation is taken *before* the message is stored (SET NX / a
unique row), so two nodes receiving the same dedup_id at once store it once; the loser waits
for the winner's ID, and a failed enqueue gives its reservation back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from queues.engine.partition import PartitionUnavailable
from queues.models import DedupEntry

log = logging.getLogger(__name__)

_PENDING = ""
_WAIT = 3.0
#: Seconds a reservation lasts before its message is confirmed (the queue's window when
#: shorter): longer than an enqueue call can take (its store, database and forwarded calls
#: time out well within it), so that a caller that died between reserving and confirming (a
#: node killed mid-call) blocks a retry of its dedup_id for this long, not for the whole window.
PENDING_TTL = 60


def _pending_ttl(window: int) -> int:
    return max(1, min(window, PENDING_TTL))


class DedupStore:
    def reserve(self, queue: str, dedup_id: str, window: int) -> str | None:
        """None if this caller now owns the dedup_id (for :data:`PENDING_TTL` seconds until
        :meth:`confirm` keeps it for ``window``); else the first message's ID. Raises
        PartitionUnavailable (503) when another call holds it unconfirmed for over ``_WAIT`` s."""
        give_up = time.monotonic() + _WAIT
        while True:
            existing = self._claim(queue, dedup_id, window)
            if existing is None or existing != _PENDING:
                return existing
            if time.monotonic() > give_up:
                raise PartitionUnavailable(f"dedup_id {dedup_id!r} is being enqueued by another call; retry")
            time.sleep(0.02)

    def reserve_many(self, queue: str, dedup_ids: Sequence[str], window: int) -> dict[str, str | None]:
        """:meth:`reserve` for each of ``dedup_ids`` (distinct): ``{dedup_id: None (now this
        caller's) or the first message's ID}``. All or nothing: when one cannot be had
        (PartitionUnavailable, a store error), those this call took are given back first."""
        out: dict[str, str | None] = {}
        try:
            for dedup_id in dedup_ids:
                out[dedup_id] = self.reserve(queue, dedup_id, window)
        except BaseException:
            self._give_back(queue, [d for d, existing in out.items() if existing is None])
            raise
        return out

    def _give_back(self, queue: str, dedup_ids: Sequence[str]) -> None:
        for dedup_id in dedup_ids:
            try:
                self.release(queue, dedup_id)
            except Exception as exc:  # noqa: BLE001 - the store is down: they lapse after PENDING_TTL
                log.warning("dedup: could not give back reservations of %s: %s", queue, exc)
                return

    def _claim(self, queue: str, dedup_id: str, window: int) -> str | None:
        raise NotImplementedError

    def confirm(self, queue: str, dedup_id: str, message_id: str, window: int) -> None:
        raise NotImplementedError

    def confirm_many(self, queue: str, stored: Sequence[tuple[str, str]], window: int) -> None:
        """:meth:`confirm` each ``(dedup_id, message_id)``."""
        for dedup_id, message_id in stored:
            self.confirm(queue, dedup_id, message_id, window)

    def release(self, queue: str, dedup_id: str) -> None:
        raise NotImplementedError

    def expire(self) -> int:
        """Forget the dedup_ids past their window; how many (Redis: its TTL does it, 0)."""
        return 0

    def forget(self, queue: str) -> None:
        """Drop every dedup_id of ``queue`` (it is being deleted): a queue created again under
        the name must take a retried dedup_id as a new message, not answer with the ID of one
        that went with the old queue."""
        raise NotImplementedError


class RedisDedup(DedupStore):
    def __init__(self) -> None:
        from django_redis import get_redis_connection

        self.redis = get_redis_connection("default")

    @staticmethod
    def _key(queue: str, dedup_id: str) -> str:
        # Under the service's key prefix, like the store's keys (the cache's Redis may be shared).
        return f"{settings.KV_PREFIX}dedup:{queue}:{dedup_id}"

    def _claim(self, queue: str, dedup_id: str, window: int) -> str | None:
        key = self._key(queue, dedup_id)
        if self.redis.set(key, _PENDING, nx=True, ex=_pending_ttl(window)):
            return None
        value = self.redis.get(key)
        return _PENDING if value is None else value.decode()  # None: it just expired; try again

    def reserve_many(self, queue: str, dedup_ids: Sequence[str], window: int) -> dict[str, str | None]:
        """One pipeline of ``SET NX EX`` for the batch, one ``MGET`` of those taken already, and
        again for those another call holds unconfirmed, for up to ``_WAIT`` seconds."""
        out: dict[str, str | None] = {}
        todo = list(dedup_ids)
        ttl = _pending_ttl(window)
        give_up = time.monotonic() + _WAIT
        try:
            while True:
                pipe = self.redis.pipeline(transaction=False)
                for dedup_id in todo:
                    pipe.set(self._key(queue, dedup_id), _PENDING, nx=True, ex=ttl)
                taken = pipe.execute()
                held = [d for d, ok in zip(todo, taken) if not ok]
                out.update((d, None) for d, ok in zip(todo, taken) if ok)
                todo = []
                if held:
                    for dedup_id, value in zip(held, self.redis.mget([self._key(queue, d) for d in held])):
                        if value is None or value.decode() == _PENDING:  # expired meanwhile, or pending
                            todo.append(dedup_id)
                        else:
                            out[dedup_id] = value.decode()
                if not todo:
                    return out
                if time.monotonic() > give_up:
                    raise PartitionUnavailable(f"dedup_id {todo[0]!r} is being enqueued by another call; retry")
                time.sleep(0.02)
        except BaseException:
            self._give_back(queue, [d for d, existing in out.items() if existing is None])
            raise

    def _give_back(self, queue: str, dedup_ids: Sequence[str]) -> None:
        if dedup_ids:
            try:
                self.redis.delete(*[self._key(queue, d) for d in dedup_ids])
            except Exception as exc:  # noqa: BLE001 - Redis is down: they lapse after PENDING_TTL
                log.warning("dedup: could not give back %d reservations of %s: %s", len(dedup_ids), queue, exc)

    def confirm(self, queue: str, dedup_id: str, message_id: str, window: int) -> None:
        self.redis.set(self._key(queue, dedup_id), message_id, ex=max(window, 1))

    def confirm_many(self, queue: str, stored: Sequence[tuple[str, str]], window: int) -> None:
        """One pipeline of ``SET EX`` for the batch."""
        pipe = self.redis.pipeline(transaction=False)
        for dedup_id, message_id in stored:
            pipe.set(self._key(queue, dedup_id), message_id, ex=max(window, 1))
        pipe.execute()

    def release(self, queue: str, dedup_id: str) -> None:
        self.redis.delete(self._key(queue, dedup_id))

    def forget(self, queue: str) -> None:
        # Queue names have no ":" nor glob characters (public.QUEUE_NAME_RE): the pattern is
        # this queue's keys only.
        batch: list[bytes] = []
        for key in self.redis.scan_iter(match=self._key(queue, "*"), count=1000):
            batch.append(key)
            if len(batch) >= 500:
                self.redis.delete(*batch)
                batch = []
        if batch:
            self.redis.delete(*batch)


class DatabaseDedup(DedupStore):
    def _claim(self, queue: str, dedup_id: str, window: int) -> str | None:
        now = timezone.now()
        try:
            with transaction.atomic():
                DedupEntry.objects.create(
                    queue=queue,
                    dedup_id=dedup_id,
                    message_id=_PENDING,
                    expires_at=now + timedelta(seconds=_pending_ttl(window)),
                )
            return None
        except IntegrityError:
            pass
        entry = DedupEntry.objects.filter(queue=queue, dedup_id=dedup_id).first()
        if entry is None:
            return _PENDING  # released in between: try again
        if entry.expires_at <= now:
            taken = DedupEntry.objects.filter(pk=entry.pk, expires_at=entry.expires_at).update(
                message_id=_PENDING, expires_at=now + timedelta(seconds=_pending_ttl(window))
            )
            return None if taken else _PENDING
        return entry.message_id

    def confirm(self, queue: str, dedup_id: str, message_id: str, window: int) -> None:
        DedupEntry.objects.filter(queue=queue, dedup_id=dedup_id).update(
            message_id=message_id, expires_at=timezone.now() + timedelta(seconds=window)
        )

    def release(self, queue: str, dedup_id: str) -> None:
        DedupEntry.objects.filter(queue=queue, dedup_id=dedup_id, message_id=_PENDING).delete()

    def expire(self) -> int:
        """One DELETE of the rows past their window (indexed on ``expires_at``): they were
        never deleted, only taken over by a repeat of the same dedup_id."""
        deleted, _ = DedupEntry.objects.filter(expires_at__lt=timezone.now()).delete()
        return deleted

    def forget(self, queue: str) -> None:
        DedupEntry.objects.filter(queue=queue).delete()


_store: DedupStore | None = None


def get_dedup() -> DedupStore:
    global _store
    if _store is None:
        _store = RedisDedup() if settings.REDIS_URL else DatabaseDedup()
    return _store
