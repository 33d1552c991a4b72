"""``GET /metrics`` (Prometheus' text format) and ``GET /api/v1/readyz``.

``/metrics`` is for the operator's Prometheus only: a request passes with the bearer token of
``METRICS_TOKEN`` (a secret of its own, never a user's API token), or without any token from
an address in ``METRICS_ALLOW`` (networks; loopback by default); anything else, a wrong token
included, is refused with 403. The address is the connection's (``REMOTE_ADDR``): a proxy's
``X-Forwarded-For`` is not believed.

With ``PROMETHEUS_MULTIPROC_DIR`` set, the counters and histograms of every process of the
node are added up from that folder (``prometheus_client``'s multiprocess mode); the figures
read at scrape time (``queues.service.figures``) are those of the process that answers.

``readyz`` needs no token and says only which checks fail (no addresses, no errors).
"""

from __future__ import annotations

import hmac
import ipaddress
import os

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from ..service.figures import NodeCollector, readiness

#: Seconds a client should wait before asking ``readyz`` again.
READY_RETRY_AFTER = 5

_NODE = CollectorRegistry(auto_describe=False)
_NODE.register(NodeCollector())


def metrics_allowed(request: HttpRequest) -> bool:
    """The bearer token of ``METRICS_TOKEN``, or no token and an address in ``METRICS_ALLOW``."""
    scheme, _, value = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme or value:
        token = settings.METRICS_TOKEN
        return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token)
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in settings.METRICS_ALLOW)


def _events() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return JsonResponse(
            {"error": "permission_denied", "detail": "/metrics needs METRICS_TOKEN or an address in METRICS_ALLOW"},
            status=403,
        )
    return HttpResponse(_events() + generate_latest(_NODE), content_type=CONTENT_TYPE_LATEST)


@require_GET
def readyz_view(request: HttpRequest) -> HttpResponse:
    checks = readiness()
    failing = sorted(name for name, ok in checks.items() if not ok)
    if not failing:
        return JsonResponse({"status": "ready"})
    response = JsonResponse({"status": "not_ready", "not_ready": failing}, status=503)
    response["Retry-After"] = str(READY_RETRY_AFTER)
    return response
