"""Token authentication with a short in-process cache.

DRF's ``TokenAuthentication`` reads the token and its user from the database on every call;
at a few hundred calls a second that is most of a request's cost. A key is trusted from the
cache for ``TTL`` seconds, so a deleted token stops working within that time.
"""

from __future__ import annotations

import threading
import time

from rest_framework.authentication import BaseAuthentication, TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from .router import cluster_secret_ok

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


class ClusterPeer:
    """The identity of a call forwarded by another node."""

    is_authenticated = True
    is_active = True
    is_staff = False
    username = "cluster-peer"

    def __str__(self) -> str:
        return self.username


class ClusterAuthentication(BaseAuthentication):
    """Nodes forward calls with the cluster secret, never with a user's token."""

    header = "HTTP_X_MQ_CLUSTER_SECRET"

    def authenticate(self, request):
        value = request.META.get(self.header)
        if value is None:
            return None
        if not cluster_secret_ok(value):
            raise AuthenticationFailed("bad cluster secret")
        return ClusterPeer(), None
