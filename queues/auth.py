"""Token authentication with a short in-process cache.

DRF's ``TokenAuthentication`` reads the token and its user from the database on every call;
at a few hundred calls a second that is most of a request's cost. A key is trusted from the
cache for ``TTL`` seconds, so a deleted token stops working within that time.
"""

from __future__ import annotations

import threading
import time

from rest_framework.authentication import TokenAuthentication

TTL = 5.0


class CachedTokenAuthentication(TokenAuthentication):
    _cache: dict[str, tuple[float, tuple]] = {}
    _lock = threading.Lock()

    def authenticate_credentials(self, key):
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        result = super().authenticate_credentials(key)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + TTL, result)
        return result

    @classmethod
    def forget(cls) -> None:
        with cls._lock:
            cls._cache.clear()
