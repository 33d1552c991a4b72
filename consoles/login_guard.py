"""Failed console logins, counted per username and per client address in Django's cache.

Past ``ADMIN_LOGIN_FAILURES`` failures for a username (or 4x that from one address) within
``ADMIN_LOGIN_WINDOW`` seconds, the login answers 429 with ``Retry-After`` until the window
ends, whatever the password: guessing passwords costs the window per few tries. The count per
username lets an attacker lock that user out of the console for a window (not out of the API:
tokens are not affected); the count per address catches one client trying many names. Behind a
proxy every client has the proxy's address: the per-address limit then counts them together.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

#: the per-address limit, as a multiple of the per-username one.
PER_ADDRESS = 4


def _keys(request: HttpRequest) -> list[tuple[str, int]]:
    """``(cache key, limit)`` of the request's username and address."""
    limit = settings.ADMIN_LOGIN_FAILURES
    username = request.POST.get("username", "").strip().lower()
    digest = hashlib.sha256(username.encode()).hexdigest()[:32]  # any length, any characters
    address = request.META.get("REMOTE_ADDR", "")
    return [(f"login-failures:user:{digest}", limit), (f"login-failures:addr:{address}", limit * PER_ADDRESS)]


def refused(request: HttpRequest) -> bool:
    """Whether this login attempt is refused (too many failures for its username or address)."""
    counts = cache.get_many([key for key, _ in _keys(request)])
    return any(counts.get(key, 0) >= limit for key, limit in _keys(request))


def failed(request: HttpRequest) -> None:
    """Count a failed attempt; the window starts at the first failure."""
    for key, _ in _keys(request):
        cache.add(key, 0, settings.ADMIN_LOGIN_WINDOW)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, settings.ADMIN_LOGIN_WINDOW)


def forget(request: HttpRequest) -> None:
    """Forget the counts of the request's username and address (a test's cleanup)."""
    cache.delete_many([key for key, _ in _keys(request)])
