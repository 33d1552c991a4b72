"""Fixtures of the integration tests.

Two kinds of test live here. In-process tests call the node runtime of the test process
(``runtime``, ``api``, ``make_queue``: tests/conftest.py). Cluster tests start node processes
(``manage.py runnode``) with :func:`nodes` or :func:`node` and call them over HTTP; they are
marked ``cluster`` (by themselves when they use these fixtures), and ``-m "not cluster"``
leaves them out.

``@pytest.mark.node(...)`` on a test or a module sets up its nodes:

- ``env={"NAME": "value"}``: settings of every node (on top of ``NODE_HEARTBEAT=0.3``);
- ``backend="redis"``: their key-value store (``tests.launcher.KV_BACKENDS``; Redis db 5, emptied
  before and after the test, by default);
- ``processes=N``: ``runnode --processes`` of each (1 by default).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.integration.nodes import KV_REDIS_DB, NodeSet, in_cluster_of, local_node_env
from tests.launcher import KV_BACKENDS, NodeProcess

#: Every node of a test beats this often (seconds): a takeover or a grant shows within moments.
HEARTBEAT = "0.3"


@pytest.fixture
def nodes(request, transactional_db, tmp_path) -> NodeSet:
    """Node processes started on demand (``nodes.start(processes=None, **env)``), all stopped at
    the end: on the test database (so the test is transactional: a node sees only committed
    rows), their data and logs under ``tmp_path``, set up by the test's ``node`` marker."""
    marker = request.node.get_closest_marker("node")
    options = dict(marker.kwargs) if marker else {}
    backend = options.pop("backend", "redis")
    processes = options.pop("processes", None)
    env = {"NODE_HEARTBEAT": HEARTBEAT, **options.pop("env", {})}
    if options or (marker and marker.args):
        raise TypeError(f"@pytest.mark.node takes env=, backend= and processes= only, not {marker}")
    if backend not in KV_BACKENDS:
        raise ValueError(f"@pytest.mark.node(backend={backend!r}): one of {', '.join(KV_BACKENDS)}")
    if backend == "redis":
        request.getfixturevalue("redis_client")  # db 5 emptied around the test; skipped without Redis
    elif backend == "redis-cluster":
        request.getfixturevalue("redis_cluster_client")
    started = NodeSet(local_node_env(tmp_path, backend, **env), tmp_path, processes=processes)
    yield started
    started.stop()


@pytest.fixture
def node(nodes) -> NodeProcess:
    """One node process, as :func:`nodes` starts them."""
    return nodes.start()


@pytest.fixture
def cluster_member(node) -> Iterator[NodeProcess]:
    """``node``, with this process a member of its cluster for the test (:func:`in_cluster_of`):
    a key revoked or a user changed here is announced to the node as an admin's would be."""
    with in_cluster_of(node):
        yield node


@pytest.fixture(scope="module")
def module_node(request, django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[NodeProcess]:
    """One node process for a whole module whose tests call it over HTTP with rows of their own
    committed (:func:`committed`), since the node reads them; all of it
    removed at the module's end, as a transactional test's teardown does. A node start and stop
    a test cost more than most such tests' calls. The module's ``@pytest.mark.node(env=...)``
    sets its settings (a test's own marker is for :func:`nodes`: this node is the module's)."""
    import redis
    from django.core.management import call_command

    marker = request.node.get_closest_marker("node")  # the module's (request.node: the module)
    options = dict(marker.kwargs) if marker else {}
    env = {"NODE_HEARTBEAT": HEARTBEAT, **options.pop("env", {})}
    if options or (marker and marker.args):
        raise TypeError(f"module_node takes @pytest.mark.node(env=) only, not {marker}")
    if not os.environ.get("MQ_TEST_REDIS_URL"):
        pytest.skip("MQ_TEST_REDIS_URL is not set (make test sets it)")
    kv = redis.Redis.from_url(os.environ["MQ_TEST_REDIS_URL"] + f"/{KV_REDIS_DB}")
    kv.flushdb()
    with django_db_blocker.unblock():
        tmp = tmp_path_factory.mktemp("module-node")
        started = NodeSet(local_node_env(tmp, **env), tmp)
        try:
            yield started.start()
        finally:
            started.stop()
            call_command("flush", interactive=False, verbosity=0)
            kv.flushdb()
            kv.close()


@pytest.fixture(scope="module")
def committed(django_db_blocker):
    """``committed(lambda: ...)``: run an ORM call on a connection of its own, committed at once,
    so that a node process reads its rows even while a test's transaction is open; the module's
    node removes them at its end (:func:`module_node`)."""
    import threading

    from django.db import connection

    def run(build):  # type: ignore[no-untyped-def]
        out: dict[str, object] = {}

        def work() -> None:
            try:
                with django_db_blocker.unblock():
                    out["value"] = build()
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                out["error"] = exc
            finally:
                connection.close()

        t = threading.Thread(target=work)
        t.start()
        t.join()
        if "error" in out:
            raise out["error"]  # type: ignore[misc]
        return out["value"]

    return run
