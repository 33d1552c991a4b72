"""Key-value store backends, chosen by the scheme of ``KV_URL``.

``file:///path`` (the embedded default), ``redis://host:port/db`` (through django-redis),
``redis-cluster://host:port,host:port,...`` (a Redis Cluster, named by seed nodes) and
``postgres`` (a table in the default database); ``memory://`` for unit tests. An unknown scheme
fails loudly at start-up.

The service's store (:func:`get_store`) is a view under ``KV_PREFIX`` (``mq:`` by default):
every key it writes starts with it and ``delete_prefix`` reaches nothing outside it, so a
Redis database may be shared with Celery's broker or another application.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from queues.kv.base import Fence, Fenced, KeyValueStore, KVError, PrefixedStore, ReplicationError

__all__ = [
    "Fence",
    "Fenced",
    "KVError",
    "KeyValueStore",
    "PrefixedStore",
    "ReplicationError",
    "get_store",
    "open_store",
    "reset_store",
]


def _file(url: str) -> KeyValueStore:
    from queues.kv.filesystem import FileStore

    return FileStore.from_url(url)


def _redis(url: str) -> KeyValueStore:
    from queues.kv.redis import RedisStore

    return RedisStore.from_settings()


def _redis_cluster(url: str) -> KeyValueStore:
    from django.conf import settings

    from queues.kv.redis_cluster import RedisClusterStore

    return RedisClusterStore.from_url(url, min_replicas=settings.KV_MIN_REPLICAS)


def _memory(url: str) -> KeyValueStore:
    from queues.kv.memory import MemoryStore

    return MemoryStore()


def _sql(url: str) -> KeyValueStore:
    from queues.kv.sql import SQLStore

    return SQLStore()


# scheme of ``KV_URL`` -> the factory that opens it. Each factory imports its backend when it
# is called, so a backend's client library is loaded only where it is used.
BACKENDS: dict[str, Callable[[str], KeyValueStore]] = {
    "file": _file,
    "redis": _redis,
    "rediss": _redis,
    "unix": _redis,
    "redis-cluster": _redis_cluster,
    "rediss-cluster": _redis_cluster,
    "memory": _memory,
    "postgres": _sql,
    "postgresql": _sql,
    "sql": _sql,
}


def open_store(url: str) -> KeyValueStore:
    scheme = urlsplit(url).scheme or url
    factory = BACKENDS.get(scheme)
    if factory is None:
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"KV_URL={url!r}: unknown scheme {scheme!r}; use file:///path, redis://host:port/db, "
            "redis-cluster://host:port,host:port,... or postgres"
        )
    return factory(url)


_store: KeyValueStore | None = None
_lock = threading.Lock()


def get_store() -> KeyValueStore:
    """The process's store, opened from settings on first use: ``KV_URL`` under ``KV_PREFIX``."""
    global _store
    if _store is None:
        with _lock:
            if _store is None:
                from django.conf import settings

                _store = open_store(settings.KV_URL).within(settings.KV_PREFIX)
    return _store


def reset_store() -> None:
    """Forget the process's store (tests switch backends)."""
    global _store
    with _lock:
        if _store is not None:
            _store.close()
        _store = None
