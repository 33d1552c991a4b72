"""A topic's own page in the console (``admin:topic``): its figures, its subscriptions with their
positions and backlogs, its partitions and where its archive is. No queue-only field: a topic
is read through its subscriptions, each with a dead-letter queue and a receive limit of its own.

Read through the service with the console's user as the caller (``read`` on the topic): a
topic the user may not read answers 404, as one that does not exist.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from queues import service
from queues.access import Caller


def topic(request: HttpRequest, name: str, site: admin.AdminSite) -> HttpResponse:
    caller = Caller.of(request.user)
    try:
        t = service.get_queue(name, "topic", caller=caller)
        stats = service.queue_stats(t.name, caller=caller)
    except service.QueueNotFound:
        raise Http404(f"no topic {name!r} you may read") from None
    subs = {s.name: s for s in t.subscriptions.select_related("dead_letter_queue").order_by("name")}
    subscriptions = []
    for sub_name, figures in sorted((stats.get("subscriptions") or {}).items()):
        row = subs.get(sub_name)
        subscriptions.append(
            {
                "name": sub_name,
                "row": row,
                "url": reverse("admin:queues_subscription_change", args=[row.pk]) if row else None,
                "figures": figures,
                "positions": [(p["index"], p["dequeue_id"] or "-", p["held"]) for p in figures["partitions"]],
            }
        )
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": f"Topic {t.name}",
        "topic": t,
        "stats": stats,
        "subscriptions": subscriptions,
        "settings_url": reverse("admin:queues_queue_change", args=[t.pk]),
        "archive_url": reverse("admin:archive_archivedmessage_changelist") + f"?queue={t.name}",
        "partitions_url": reverse("admin:queues_partition_changelist") + f"?queue__id__exact={t.pk}",
        "add_subscription_url": reverse("admin:queues_subscription_add") + f"?topic={t.pk}",
    }
    return TemplateResponse(request, "consoles/topic.html", context)
