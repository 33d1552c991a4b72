"""Views that need none of Django's middleware, served by the REST API's WSGI fast path
(``queues.api.fastpath``) before Django: an app registers one here from its ``ready()``."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

#: ``(path, view)``: views that use nothing of Django's middleware (no session, cookie, CSRF
#: token, message or login: they find their caller in the request themselves, before its body)
#: and answer every error in their own protocol; the fast path hands them a POST to their path
#: or under it as Django's request, with the rest of the path after ``path/`` ("" for ``path``
#: itself): the SQS endpoint. Its answer is Django's response, or the answer as it is
#: (:data:`DirectAnswer`), which spares making a response of it.
DirectAnswer = tuple[int, list[tuple[str, str]], bytes]
DirectView = Callable[[HttpRequest, str], HttpResponse | DirectAnswer]
_DIRECT: list[tuple[str, DirectView]] = []


def register_direct_view(path: str, view: DirectView) -> None:
    """Serve POSTs to ``path`` (``/name``, no ``/`` at its end) and under it with ``view``
    (see :data:`_DIRECT`)."""
    if not path.startswith("/") or path.endswith("/"):
        raise ValueError(f"a direct view's path starts with '/' and does not end with one: {path!r}")
    if (path, view) not in _DIRECT:
        _DIRECT.append((path, view))


def direct_view(path: str) -> tuple[str, DirectView] | None:
    """The registered view serving ``path`` and its prefix, if any."""
    for prefix, view in _DIRECT:
        if path == prefix or path.startswith(prefix + "/"):
            return prefix, view
    return None
