"""Token authentication with a short in-process cache, the cluster's own authentication, and
the :class:`~queues.access.Caller` a request acts as.

DRF's ``TokenAuthentication`` reads the token and its user from the database on every call;
at a few hundred calls a second that is most of a request's cost. A key is trusted from the
cache for ``TTL`` seconds, or until an access change (a token deleted, a user or its groups
changed, a grant) made in this process or a sibling of its node (``queues.access.changes``):
so a deleted token stops working at once on its node and within ``TTL`` on the others; so do a
user's groups (its ``Caller``).

A node forwards a call signed with the cluster secret (``queues.cluster.peerauth``: an HMAC over the
request, its hop count, its user and a timestamp) naming in ``X-MQ-On-Behalf-Of`` the user's
id, or ``system`` for the service's own work: the receiving node acts as that user and checks
its rights again. Without the header a node may make only the node-only calls (refresh, the
``close_only`` purge, expire). The outbox relay, a process of the cluster that holds its secret
and no user's token, sends a row's enqueue so for the row's writer (``queues.service.on_behalf``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.request import Request

from queues.access import ANONYMOUS, SYSTEM, Caller, changes
from queues.cluster import peerauth
from queues.cluster.router import hops_of

if TYPE_CHECKING:
    from drf_spectacular.openapi import AutoSchema

TTL = 5.0


class CachedTokenAuthentication(TokenAuthentication):
    """DRF's token check, its answer kept for ``TTL`` seconds while no access change was made in
    this process or a sibling of its node (``queues.access.changes``)."""

    #: token -> (until (monotonic), the access generation it was read at, (user, token)).
    _cache: dict[str, tuple[float, int, tuple[Any, Any]]] = {}
    _lock = threading.Lock()

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        now = time.monotonic()
        generation = changes.generation()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now and hit[1] == generation:
            return hit[2]
        result = super().authenticate_credentials(key)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + TTL, generation, result)
        return result

    @classmethod
    def forget(cls) -> None:
        with cls._lock:
            cls._cache.clear()
        _Callers.forget()


# A token deleted (revoked, or its user deleted) is an access change: trusted no more in this
# process and its siblings once the deletion commits, on the other nodes within ``TTL``.
post_delete.connect(changes.changed, sender=Token, dispatch_uid="queues.http.auth.token_deleted")


class _Callers:
    """user id -> Caller (its groups read once), trusted for ``TTL`` seconds while no access
    change was made in this process or a sibling (``queues.access.changes``)."""

    _cache: dict[int, tuple[float, int, Caller]] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, user_id: int, load: Callable[[], Caller]) -> Caller:
        now = time.monotonic()
        generation = changes.generation()
        hit = cls._cache.get(user_id)
        if hit is not None and hit[0] > now and hit[1] == generation:
            return hit[2]
        caller = load()
        with cls._lock:
            if len(cls._cache) > 10_000:
                cls._cache.clear()
            cls._cache[user_id] = (now + TTL, generation, caller)
        return caller

    @classmethod
    def forget(cls) -> None:
        with cls._lock:
            cls._cache.clear()


def caller_of(user: Any) -> Caller:
    """The caller a request's user acts as (cached; an anonymous user is ``ANONYMOUS``)."""
    if isinstance(user, ClusterPeer):
        raise TypeError("a node's call: use request_caller")
    if user is None or not getattr(user, "is_authenticated", False) or getattr(user, "pk", None) is None:
        return ANONYMOUS
    return _Callers.get(user.pk, lambda: Caller.of(user))


def caller_on_behalf_of(value: str) -> Caller:
    """The caller named by a forwarded call's ``X-MQ-On-Behalf-Of``: ``system`` or a user's id.
    Raises AuthenticationFailed (no such active user)."""
    if value == "system":
        return SYSTEM
    if not (value.isascii() and value.isdigit()):
        raise AuthenticationFailed("X-MQ-On-Behalf-Of must be a user id or 'system'")
    try:
        return caller_of_id(int(value))
    except AuthenticationFailed:
        raise AuthenticationFailed(f"X-MQ-On-Behalf-Of names no active user ({value})") from None


def caller_of_id(user_id: int) -> Caller:
    """The caller active user ``user_id`` acts as (cached as :func:`caller_of`). Raises
    AuthenticationFailed (no such active user)."""

    def load() -> Caller:
        user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
        if user is None:
            raise AuthenticationFailed(f"no active user {user_id}")
        return Caller.of(user)

    return _Callers.get(user_id, load)


def on_behalf_value(caller: Caller) -> str:
    """``X-MQ-On-Behalf-Of`` for a call forwarded for ``caller``."""
    if caller.system:
        return "system"
    if caller.user_id is None:
        raise ValueError("an anonymous caller's call is never forwarded")
    return str(caller.user_id)


class ClusterPeer:
    """The identity of a call forwarded by another node (its signature checked); ``caller``:
    the user it acts for (None: the node's own call, which may only be a node-only one);
    ``hops``: the hop count it was signed with."""

    is_authenticated = True
    is_active = True
    is_staff = False
    username = "cluster-peer"

    def __init__(self, caller: Caller | None = None, hops: int = 0):
        self.caller = caller
        self.hops = hops

    def __str__(self) -> str:
        return self.username if self.caller is None else f"{self.username} for {self.caller}"


def request_hops(user: Any) -> int:
    """The hop count a request has made: a node's signed count; a client's is 0, whatever
    ``X-MQ-Hops`` it sends (a client must not skip forwarding or cooling)."""
    return user.hops if isinstance(user, ClusterPeer) else 0


def peer_of(environ: Any, method: str, path: str) -> tuple[ClusterPeer, peerauth.PeerCall] | None:
    """The node a request proves it comes from by its headers (``peerauth.verify_headers``),
    acting for the user it names, and the call as signed (its body still to be checked with
    :func:`check_peer_body` once read); None: it does not claim to come from a node. Raises
    AuthenticationFailed. Nothing of the body is read: a caller that only claims to be a node
    is refused before it can make this process wait for or hold its body."""
    try:
        call = peerauth.verify_headers(environ, method, path)
    except peerauth.PeerAuthFailed as exc:
        raise AuthenticationFailed(str(exc)) from None
    if call is None:
        return None
    caller = caller_on_behalf_of(call.on_behalf) if call.on_behalf is not None else None
    return ClusterPeer(caller, hops_of(call.hops)), call


def check_peer_body(call: peerauth.PeerCall, body: bytes) -> None:
    """AuthenticationFailed unless ``body`` is the one the node signed."""
    try:
        peerauth.check_body(call, body)
    except peerauth.PeerAuthFailed as exc:
        raise AuthenticationFailed(str(exc)) from None


def request_caller(user: Any, *, node_only: bool = False) -> Caller:
    """Who a request acts as: its user; a node's call acts for the user it names, and one that
    names none is the node's own (``SYSTEM``), allowed only for a ``node_only`` call. Raises
    PermissionDenied (a node's own call to anything else)."""
    if isinstance(user, ClusterPeer):
        if user.caller is not None:
            return user.caller
        if node_only:
            return SYSTEM
        raise PermissionDenied(
            "a node's call must name the user it acts for (X-MQ-On-Behalf-Of); "
            "without it only refresh, close_only purge and expire are allowed"
        )
    return caller_of(user)


class ClusterAuthentication(BaseAuthentication):
    """Nodes forward calls signed with the cluster secret (never with a user's token, never
    the secret itself) for the user they act for (``X-MQ-On-Behalf-Of``)."""

    def authenticate(self, request: Request) -> tuple[ClusterPeer, None] | None:
        meta = request.META
        if peerauth.SIGNATURE_META not in meta and peerauth.LEGACY_SECRET_META not in meta:
            return None
        found = peer_of(meta, request.method or "", peerauth.request_path(meta))
        if found is None:
            return None
        peer, call = found
        # The signature holds: now the body (read once; DRF parses it from Django's copy
        # afterwards). DRF's Request gives the HttpRequest's own attributes, ``body`` among them.
        check_peer_body(call, request.body)
        return peer, None

    def authenticate_header(self, request: Request) -> str:
        return peerauth.SIGNATURE_HEADER


class ClusterAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]  # drf-spectacular's __init_subclass__ is unannotated
    """How the OpenAPI schema (``/api/schema/``, the docs) describes :class:`ClusterAuthentication`.

    Defined here so it is registered whenever DRF loads the authentication classes.
    """

    target_class = ClusterAuthentication
    name = "clusterSignature"

    def get_security_definition(self, auto_schema: AutoSchema) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": peerauth.SIGNATURE_HEADER,
            "description": (
                "Calls one node forwards to another, not for clients: HMAC-SHA256 under the cluster secret "
                f"over the request, with {peerauth.TIMESTAMP_HEADER}, {peerauth.NONCE_HEADER}, "
                f"{peerauth.CONTENT_HEADER}, {peerauth.HOPS_HEADER} and {peerauth.ON_BEHALF_HEADER}."
            ),
        }
