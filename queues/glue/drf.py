"""Django REST framework's private names: the Django request a DRF request wraps.

DRF's ``Request`` proxies unknown attributes to the Django ``HttpRequest`` it wraps, but it has
a ``user`` of its own (its authenticators'), and the body must be read from Django's request
before DRF parses it. So two places need the wrapped request itself, which DRF keeps in the
undocumented ``Request._request``.

On a DRF upgrade, check (checked against djangorestframework==3.18.3, pinned in
requirements.txt) that ``Request._request`` is still the ``HttpRequest`` given to
``Request(...)``; ``tests/unit/test_glue.py`` fails if it is not.
"""

from __future__ import annotations

from django.http import HttpRequest
from rest_framework.request import Request


def django_request(request: Request) -> HttpRequest:
    """The Django request ``request`` wraps (with AuthenticationMiddleware's ``user``, and the
    body DRF has not read yet)."""
    return request._request
