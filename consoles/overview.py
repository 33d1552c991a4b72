"""The console's overview page (``admin:overview``): the whole cluster at a glance, and its
figures as JSON (``admin:overview_json``) that the page polls to refresh itself: the page
opens with each queue's rate history of the last hour and asks, at each poll, for the points
after the last it has (``?history_after=``).

Everything is read through :func:`queues.service.cluster_overview` with the console's user as
the caller: the queues and topics it may read, and the nodes when it may view nodes
(``queues.view_node``, the permission the nodes' list needs).
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse

from queues import service
from queues.access import Caller

#: Seconds between the page's polls: the owners publish their figures at each heartbeat.
POLL_SECONDS = 2.0


def figures(request: HttpRequest, history_after: float | None = None) -> service.Overview:
    return service.cluster_overview(
        Caller.of(request.user), with_nodes=request.user.has_perm("queues.view_node"), history_after=history_after
    )


def _after(raw: str | None) -> float | None:
    """``?history_after=`` (epoch seconds: the page has the rate history up to then), else None."""
    try:
        value = float(raw or "")
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    # (a time outside what a datetime holds asks for nothing newer, or everything kept)
    return min(max(value, 0.0), MAX_EPOCH)


#: The latest ``history_after`` taken (the year 9000): past it, a datetime cannot hold it.
MAX_EPOCH = 221_845_392_000.0


def overview_json(request: HttpRequest) -> JsonResponse:
    response = JsonResponse(figures(request, _after(request.GET.get("history_after"))))
    response["Cache-Control"] = "no-store"
    return response


def overview(request: HttpRequest, site: admin.AdminSite) -> HttpResponse:
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": "Overview",
        "figures": figures(request),
        "poll_ms": int(max(POLL_SECONDS, float(settings.NODE_HEARTBEAT)) * 1000),
        "shows_nodes": request.user.has_perm("queues.view_node"),
    }
    return TemplateResponse(request, "consoles/overview.html", context)
