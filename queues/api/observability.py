"""``GET /metrics`` (Prometheus' text format) and ``GET /api/v1/readyz``.

``/metrics`` is for the operator's Prometheus only: a request passes with the bearer token of
``METRICS_TOKEN`` (a secret of its own, never a user's API token), or without any token from
an address in ``METRICS_ALLOW`` (networks; loopback by default); anything else, a wrong token
included, is refused with 403. The address is the connection's (``REMOTE_ADDR``): a proxy's
``X-Forwarded-For`` is not believed. And a request that a proxy forwarded (one with
``Forwarded``, ``X-Forwarded-For`` or ``X-Real-IP``) needs the token whatever its address: a
proxy on an allowed network (the node's own host, most often) would otherwise hand the figures,
every queue's name among them, to anyone who reaches the proxy.

With ``PROMETHEUS_MULTIPROC_DIR`` set, the counters and histograms of every process of the
runnode are added up from that folder (``prometheus_client``'s multiprocess mode). The figures
read at scrape time (``queues.service.figures``) live in each node's partition managers: on a
runnode of several processes (``runnode --processes``: sibling nodes behind one port) the node
that answers asks its siblings for theirs (``/metrics?scope=process`` at each one's address, a signed call; the
siblings are listed in ``NODE_SIBLINGS_DIR``) and adds them to its own
(:func:`merge_figures`: sums, the oldest age and cooling by the largest), so one scrape is the
runnode's. A sibling that does not answer in time is left out, and ``mq_node_processes_missing``
says how many were.

``readyz`` needs no token and says only which checks fail (no addresses, no errors).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import urllib3
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from queues.cluster import peerauth
from queues.service.figures import NodeCollector, readiness

log = logging.getLogger(__name__)

#: Seconds a client should wait before asking ``readyz`` again.
READY_RETRY_AFTER = 5

_NODE = CollectorRegistry(auto_describe=False)
_NODE.register(NodeCollector())

#: Figures of a runnode's sibling nodes combined by the largest value, not the sum.
MAX_FIGURES = frozenset({"mq_queue_oldest_age_seconds", "mq_subscription_oldest_age_seconds", "mq_node_cooling"})
#: Seconds a sibling may take to give its figures.
SIBLING_TIMEOUT = 2.0
_http = urllib3.PoolManager(num_pools=8, maxsize=4, retries=False)


def siblings() -> list[str]:
    """The addresses of this node's siblings in its runnode (``NODE_SIBLINGS_DIR``: one file per
    process, named by its pid, holding its address; a file of a dead pid is skipped)."""
    folder = os.environ.get("NODE_SIBLINGS_DIR")
    if not folder:
        return []
    out = []
    for f in Path(folder).iterdir():
        if not f.name.isdigit() or int(f.name) == os.getpid():
            continue
        try:
            os.kill(int(f.name), 0)
            out.append(f.read_text().strip())
        except (OSError, ValueError):
            continue
    return sorted(a for a in out if a)


def merge_figures(texts: Iterable[str]) -> bytes:
    """Scrape-time figures of several processes (Prometheus text) as one: each series summed
    over the processes, or its largest value for :data:`MAX_FIGURES`."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            families.setdefault(fam.name, Metric(fam.name, fam.documentation, fam.type))
            series = values.setdefault(fam.name, {})
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key in series and fam.name in MAX_FIGURES:
                    series[key] = max(series[key], sample.value)
                else:
                    series[key] = series.get(key, 0.0) + sample.value
    registry = CollectorRegistry(auto_describe=False)

    class _Merged:
        def collect(self) -> Iterable[Metric]:
            for name, fam in families.items():
                for (sample_name, labels), v in sorted(values[name].items()):
                    fam.add_sample(sample_name, dict(labels), v)
                yield fam

    registry.register(_Merged())
    return generate_latest(registry)


def _figures() -> bytes:
    """This process's scrape-time figures, and its siblings' added in (see the module doc)."""
    own = generate_latest(_NODE)
    addresses = siblings()
    if not addresses:
        return own
    texts, missing = [own.decode()], 0
    for address in addresses:
        path = "/metrics?scope=process"
        try:
            r = _http.request(
                "GET",
                f"http://{address}{path}",
                headers=peerauth.sign("GET", path, b"", 0, None, to=address),
                timeout=urllib3.Timeout(connect=0.5, read=SIBLING_TIMEOUT),
            )
            if r.status != 200:
                raise OSError(f"answered {r.status}")
            texts.append(r.data.decode())
        except Exception as exc:  # noqa: BLE001 - a sibling stopping or stopped: say so in a figure
            log.warning("figures of sibling %s: %s", address, exc)
            missing += 1
    texts.append(
        "# HELP mq_node_processes_missing Processes of this node whose figures this scrape lacks\n"
        f"# TYPE mq_node_processes_missing gauge\nmq_node_processes_missing {missing}\n"
    )
    return merge_figures(texts)


#: the headers a proxy adds to what it forwards (as the WSGI environ names them).
_PROXIED = ("HTTP_FORWARDED", "HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP")


def metrics_allowed(request: HttpRequest) -> bool:
    """The bearer token of ``METRICS_TOKEN``, or no token and an address in ``METRICS_ALLOW``
    on a request that no proxy forwarded."""
    scheme, _, value = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme or value:
        token = settings.METRICS_TOKEN
        return bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token)
    if any(h in request.META for h in _PROXIED):
        return False
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
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # no annotations upstream
        return generate_latest(registry)
    return generate_latest(REGISTRY)


def _sibling_call(request: HttpRequest) -> bool:
    """A sibling's signed ``GET /metrics?scope=process`` (its figures only)."""
    if request.GET.get("scope") != "process":
        return False
    try:
        return peerauth.verify(request.META, "GET", peerauth.request_path(request.META), b"") is not None
    except (peerauth.PeerAuthFailed, peerauth.PeerAuthBusy):
        return False


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if _sibling_call(request):
        return HttpResponse(generate_latest(_NODE), content_type=CONTENT_TYPE_LATEST)
    if not metrics_allowed(request):
        return JsonResponse(
            {
                "error": "permission_denied",
                "detail": "/metrics needs METRICS_TOKEN, or an address in METRICS_ALLOW and no proxy between",
            },
            status=403,
        )
    return HttpResponse(_events() + _figures(), content_type=CONTENT_TYPE_LATEST)


class ReadyView(APIView):
    """Readiness, for anyone (load balancers, orchestrators): 200 when the database, the store
    and the node's leases answer, else 503 naming the failing checks. No authentication and no
    throttle: a probe asks often and carries no token."""

    permission_classes = [AllowAny]
    authentication_classes: list[type[BaseAuthentication]] = []
    throttle_classes: list[type[BaseThrottle]] = []

    @extend_schema(
        summary="Readiness of this node: database, store, leases (no authentication)",
        responses={
            200: OpenApiResponse(description="ready to serve"),
            503: OpenApiResponse(description="not ready: the failing checks; ask again after Retry-After seconds"),
        },
    )
    def get(self, request: Request) -> Response:
        checks = readiness()
        failing = sorted(name for name, ok in checks.items() if not ok)
        if not failing:
            return Response({"status": "ready"})
        return Response(
            {"status": "not_ready", "not_ready": failing},
            status=503,
            headers={"Retry-After": str(READY_RETRY_AFTER)},
        )
