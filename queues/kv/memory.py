"""An in-memory backend for the unit tests of the pure core (``memory://``).

It keeps the contract of ``base.KeyValueStore`` (fences included) under one lock, and counts
calls so tests can pin the number of round trips.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Sequence

from queues.kv.base import Fence, Fenced, KeyValueStore, split_key


class MemoryStore(KeyValueStore):
    schemes = ("memory",)

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, bytes]] = defaultdict(dict)
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _check(self, fence: Fence | None) -> None:
        if fence is None:
            return
        bucket, name = split_key(fence.key)
        current = self.buckets.get(bucket, {}).get(name)
        if current is None or int(current) != fence.epoch:
            raise Fenced(f"{fence.key}: epoch {fence.epoch} is not current ({current!r})")

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        self.calls["get_many"] += 1
        with self._lock:
            out = []
            for key in keys:
                bucket, name = split_key(key)
                out.append(self.buckets.get(bucket, {}).get(name))
            return out

    def put_many(self, items: Sequence[tuple[str, bytes]], *, fence: Fence | None = None) -> None:
        self.calls["put_many"] += 1
        with self._lock:
            self._check(fence)
            for key, value in items:
                bucket, name = split_key(key)
                self.buckets[bucket][name] = bytes(value)

    def delete_many(self, keys: Sequence[str], *, fence: Fence | None = None) -> int:
        self.calls["delete_many"] += 1
        with self._lock:
            self._check(fence)
            removed = 0
            for key in keys:
                bucket, name = split_key(key)
                if self.buckets.get(bucket, {}).pop(name, None) is not None:
                    removed += 1
                    if not self.buckets[bucket]:
                        del self.buckets[bucket]
            return removed

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        self.calls["compare_and_set"] += 1
        bucket, name = split_key(key)
        with self._lock:
            if self.buckets.get(bucket, {}).get(name) != expected:
                return False
            self.buckets[bucket][name] = bytes(value)
            return True

    def scan(self, bucket: str) -> list[str]:
        self.calls["scan"] += 1
        with self._lock:
            return list(self.buckets.get(bucket, {}))

    def delete_prefix(self, prefix: str) -> None:
        with self._lock:
            for bucket in [b for b in self.buckets if b == prefix or b.startswith(prefix + "/")]:
                del self.buckets[bucket]
