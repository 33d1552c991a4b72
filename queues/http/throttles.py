"""Call rates per user and per anonymous client (``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``:
``user``, ``anon``; None: no limit), counted in Django's default cache.

DRF's own ``SimpleRateThrottle`` keeps the time of every call of a client in one cache entry,
read and written whole on every call: at the rates a queue's clients call (hundreds a second)
that list is the cost. These count calls in fixed windows instead, one ``incr`` per call; a
client may make up to twice its rate across a window's edge. With ``REDIS_URL`` the count is
the cluster's. With the embedded local-memory cache it is per process, that is per node, so a
``runnode`` of several processes (``NODE_PROCESSES`` sibling nodes behind one port) gives each
``1/NODE_PROCESSES`` of the rate (rounded up): the siblings together then allow about the rate,
as a runnode of one process does.

A call forwarded by another node is not counted again (it was counted where it came in): its
user (a cluster peer) has no ``pk``. The fast path counts its calls with :func:`check_user`.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, cast

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.locmem import LocMemCache
from rest_framework import exceptions, throttling
from rest_framework.settings import api_settings

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView


def _rates() -> dict[str, str | None]:
    # the stubs type the rates as numbers; DRF's are "N/period" strings (or None)
    return cast("dict[str, str | None]", api_settings.DEFAULT_THROTTLE_RATES)


class _Window(throttling.SimpleRateThrottle):
    scope: str
    # set by SimpleRateThrottle.__init__ from the rate; read only when the rate is set
    num_requests: int
    duration: int
    _wait = 0.0

    def get_rate(self) -> str | None:
        # read per instance, not at import: the settings' rates, even overridden in a test
        return _rates().get(self.scope)

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        num, duration = super().parse_rate(rate)
        processes = max(1, settings.NODE_PROCESSES)
        if num is not None and processes > 1 and isinstance(caches[DEFAULT_CACHE_ALIAS], LocMemCache):
            num = -(-num // processes)  # this process's share of a count it keeps alone
        return num, duration

    def allow_request(self, request: Request, view: APIView) -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        return key is None or self.hit(key)

    def hit(self, key: str) -> bool:
        """Count one call of ``key``; whether it is within the rate."""
        now = time.time()
        window = int(now // self.duration)
        counter = f"{key}:{window}"
        self.cache.add(counter, 0, self.duration + 1)
        try:
            n = self.cache.incr(counter)
        except ValueError:  # evicted between add and incr: this call starts the window
            self.cache.set(counter, 1, self.duration + 1)
            n = 1
        self._wait = (window + 1) * self.duration - now
        return n <= self.num_requests

    def wait(self) -> float:
        return math.ceil(self._wait)  # Retry-After is whole seconds: never say 0 too early


class UserRate(_Window):
    """Calls per authenticated user (its token or session)."""

    scope = "user"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        pk = getattr(request.user, "pk", None)
        if pk is None:
            return None  # anonymous (AnonRate counts it) or a cluster peer
        return self.cache_format % {"scope": self.scope, "ident": pk}


class AnonRate(_Window):
    """Calls without credentials, per client address."""

    scope = "anon"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        if request.user is not None and getattr(request.user, "is_authenticated", False):
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


def check_user(user_id: int) -> None:
    """Count a fast-path call of the user; raise ``Throttled`` (429, Retry-After) past its rate."""
    if api_settings.DEFAULT_THROTTLE_RATES.get(UserRate.scope) is None:
        return  # no limit: no throttle to make (its cache lookup and rate parsing, every call)
    throttle = UserRate()
    if throttle.rate is None:
        return
    if not throttle.hit(throttle.cache_format % {"scope": throttle.scope, "ident": user_id}):
        raise exceptions.Throttled(wait=throttle.wait())
