"""The admin lists queues and partitions with their owner node, read from the database."""

from __future__ import annotations


def test_partitions_show_their_owner_and_head(admin_client, api, make_queue, runtime):
    # given a queue whose partitions this node owns, with a message in each
    name = make_queue(partitions=2)
    for _ in range(4):
        assert api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json").status_code == 201
    runtime.tick()  # publishes the figures to the partition rows
    # when an operator opens the partition list and the queue page
    from queues.models import Queue

    queue_id = Queue.objects.get(name=name).pk
    partitions = admin_client.get("/admin/queues/partition/", {"queue__id__exact": queue_id})
    queue_page = admin_client.get("/admin/queues/queue/")
    # then the list shows the owner node's address and the epoch, from the rows, and each
    # partition's page its head block
    from queues.models import Partition

    rows = list(Partition.objects.filter(queue__name=name))
    assert partitions.status_code == 200 and queue_page.status_code == 200
    html = partitions.content.decode()
    assert html.count("test-node") >= 2
    for p in rows:
        assert p.owner_id == runtime.node_id and f'<td class="field-epoch">{p.epoch}</td>' in html
        assert (
            p.head_block
            and p.head_block in admin_client.get(f"/admin/queues/partition/{p.pk}/change/").content.decode()
        )
    assert name in queue_page.content.decode()
    # and a partition's page draws its append tree from the store
    page = admin_client.get(f"/admin/queues/partition/{rows[0].pk}/change/").content.decode()
    assert "<svg" in page and rows[0].head_block in page and 'class="block"' in page


def test_admin_needs_a_login(client):
    r = client.get("/admin/queues/partition/")
    assert r.status_code == 302 and "/admin/login/" in r["Location"]


def test_the_console_is_the_projects_own_admin_site(admin_client):
    # given the default admin site every app registers its models on
    from django.contrib import admin
    from django.test import Client

    from consoles.admin_site import ConsoleSite

    site = admin.site._wrapped if hasattr(admin.site, "_wrapped") else admin.site
    # then it is the console's, with its URLs from its class, not a patched instance
    assert type(site) is ConsoleSite and "get_urls" not in vars(site)
    labels = {m._meta.label for m in site._registry}
    assert {"queues.Queue", "queues.Partition", "workers.AttemptLog", "consoles.DashboardRun"} <= labels
    # and its index carries its header and the link to the dashboards, which need a login
    index = admin_client.get("/admin/").content.decode()
    assert ConsoleSite.site_header in index and 'href="/admin/dashboards/"' in index
    r = Client().get("/admin/dashboards/")
    assert r.status_code == 302 and "/admin/login/" in r["Location"]


def test_redrive_action_moves_dead_letters_back(admin_client, api, make_queue, runtime):
    # given a message dead-lettered after one delivery
    dlq = make_queue(partitions=1)
    source = make_queue(partitions=1, dead_letter_queue=dlq, max_receives=1)
    assert api.post(f"/api/v1/queues/{source}/enqueue", {"body": "poison"}, format="json").status_code == 201
    first = api.post(f"/api/v1/queues/{source}/dequeue", {"visibility_timeout": 0}, format="json").json()["messages"]
    assert len(first) == 1
    again = api.post(f"/api/v1/queues/{source}/dequeue", {}, format="json").json()["messages"]
    assert again == []
    from queues.models import Queue

    assert api.get(f"/api/v1/queues/{dlq}/stats").json()["depth"] == 1
    # when an operator runs the redrive action on the dead-letter queue
    r = admin_client.post(
        "/admin/queues/queue/", {"action": "redrive", "_selected_action": [Queue.objects.get(name=dlq).pk]}, follow=True
    )
    # then the message is back in its source queue
    assert r.status_code == 200 and "moved 1 back" in r.content.decode()
    back = api.post(f"/api/v1/queues/{source}/dequeue", {}, format="json").json()["messages"]
    assert [m["body"] for m in back] == ["poison"]


def test_attempts_link_message_worker_and_partition(admin_client, api, make_queue):
    # given a worker that heartbeated and reported an attempt
    name = make_queue(partitions=1)
    mid = api.post(f"/api/v1/queues/{name}/enqueue", {"body": "x"}, format="json").json()["id"]
    api.post("/api/v1/consumers/heartbeat", {"consumer": "w-1", "name": "celery@box", "queues": [name]}, format="json")
    api.post(
        "/api/v1/logs",
        {"records": [{"message_id": mid, "worker": "w-1", "attempt": 1, "outcome": "failed", "error": "boom"}]},
        format="json",
    )
    # when the operator opens the attempt log and the consumers
    attempts = admin_client.get("/admin/workers/attemptlog/").content.decode()
    consumers = admin_client.get("/admin/workers/consumer/").content.decode()
    # then the attempt links to its message's attempts, its worker and its partition
    from queues.models import Partition

    p = Partition.objects.get(queue__name=name, index=0)
    assert f"?message_id={mid}" in attempts and "/admin/workers/consumer/w-1/change/" in attempts
    assert f"/admin/queues/partition/{p.pk}/change/" in attempts and "boom" in attempts
    assert "celery@box" in consumers and "?worker__id__exact=w-1" in consumers
