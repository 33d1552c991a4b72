"""``/``: a short map of the node for a person or a script that opens its address; ``POST /``
is the SQS endpoint (clients configured with a host and port only, such as kombu's SQS
transport).

The map is JSON, public, and names only paths (no address, ID or figure of the node): the
console, the REST API and its docs, the SQS endpoint, the health checks and the metrics.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from sqs.views import root_endpoint


def links() -> dict[str, str]:
    """What ``GET /`` answers: each part of the node and the path it is served under."""
    return {
        "service": "mq: a partitioned, at-least-once message queue",
        "console": reverse("admin:index"),
        "api_docs": reverse("docs"),
        "api_schema": reverse("schema"),
        "sqs": reverse("sqs"),
        "healthz": reverse("healthz"),
        "readyz": reverse("readyz"),
        "metrics": reverse("metrics"),
    }


@csrf_exempt
def root(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return root_endpoint(request)
    if request.method not in ("GET", "HEAD"):
        response = JsonResponse(
            {"error": "method_not_allowed", "detail": f"{request.method} /: use GET (this map) or POST (SQS)"},
            status=405,
        )
        response["Allow"] = "GET, HEAD, POST"
        return response
    return JsonResponse(links())
