"""Token authentication with a short in-process cache.

DRF's ``TokenAuthentication`` reads the token and its user from the database on every call;
at a few hundred calls a second that is most of a request's cost. A key is trusted from the
cache for ``TTL`` seconds, so a deleted token stops working within that time.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from .router import SECRET_HEADER, cluster_secret_ok

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema

TTL = 5.0


class CachedTokenAuthentication(TokenAuthentication):
    _cache: dict[str, tuple[float, tuple[Any, Any]]] = {}
    _lock = threading.Lock()

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
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

    def authenticate(self, request: Request) -> tuple[ClusterPeer, None] | None:
        value = request.META.get(self.header)
        if value is None:
            return None
        if not cluster_secret_ok(value):
            raise AuthenticationFailed("bad cluster secret")
        return ClusterPeer(), None


class ClusterAuthenticationScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema (``/api/schema/``, the docs) describes :class:`ClusterAuthentication`.

    Defined here so it is registered whenever DRF loads the authentication classes.
    """

    target_class = ClusterAuthentication
    name = "clusterSecret"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": SECRET_HEADER,
            "description": "The cluster secret: calls one node forwards to another, not for clients.",
        }
