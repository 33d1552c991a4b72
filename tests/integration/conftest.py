"""Fixtures of the integration tests.

Two kinds of test live here. In-process tests call the node runtime of the test process
(``runtime``, ``api``, ``make_queue``: tests/conftest.py). Cluster tests start node processes
(``manage.py runnode``) with ``node_factory`` or ``node`` (tests/conftest.py, set up by
``@pytest.mark.node(...)``) or share the module's (:func:`module_node`) and call them over HTTP;
they are marked ``cluster`` (by themselves when they use these fixtures), and ``-m "not
cluster"`` leaves them out.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.nodes import KV_REDIS_DB, NodeSet, in_cluster_of, local_node_env, node_options
from tests.launcher import NodeProcess


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

    options = node_options(request.node)  # the module's (request.node: the module)
    if set(options) - {"env", "shared"}:
        raise TypeError(f"module_node takes @pytest.mark.node(env=, shared=) only, not {options}")
    if not os.environ.get("MQ_TEST_REDIS_URL"):
        pytest.skip("MQ_TEST_REDIS_URL is not set (make test sets it)")
    kv = redis.Redis.from_url(os.environ["MQ_TEST_REDIS_URL"] + f"/{KV_REDIS_DB}")
    kv.flushdb()
    with django_db_blocker.unblock():
        tmp = tmp_path_factory.mktemp("module-node")
        started = NodeSet(local_node_env(tmp, **options["env"]), tmp)
        try:
            yield started.start()
        finally:
            started.stop()
            call_command("flush", interactive=False, verbosity=0)
            kv.flushdb()
            kv.close()


@pytest.fixture(scope="module")
def key(committed):
    """An SQS access key (``sqs.models.AccessKey``) of a user of its own, committed (a node reads
    it), for the module's tests: each names its queues apart from the others'."""
    from django.contrib.auth.models import User

    from sqs.models import AccessKey

    return committed(lambda: AccessKey.issue(User.objects.create(username=f"sqs-{uuid.uuid4().hex[:8]}")))


@pytest.fixture
def sqs(node, key):
    """boto3's SQS client of ``node`` with :func:`key` (its retries: botocore's standard mode)."""
    from tests.integration.test_sqs_boto3 import _client

    return _client(node, key)


@pytest.fixture
def node_api(node, token):
    """A client of the node process with ``token`` (not of this process's runtime, as ``api`` is)."""
    from tests.integration.nodes import Client

    return Client(node.url, token)


@pytest.fixture
def two_nodes(node_factory) -> tuple[NodeProcess, NodeProcess]:
    """Two nodes, as the test's marker sets them up (of one process each by default: a node is
    then one owner)."""
    return node_factory(), node_factory()


@pytest.fixture(params=["json", "query"])
def sqs_api(request, module_node, key):
    """An SQS client of the module's node with :func:`key`, on each protocol in turn: AWS JSON
    1.0 (boto3) and the query protocol (tests/integration/test_sqs_aws_rules.py's ``Api``)."""
    from tests.integration.test_sqs_aws_rules import Api

    return Api(module_node, key, request.param)


@pytest.fixture(scope="module")
def committed(django_db_setup, django_db_blocker):
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
